#!/usr/bin/env bash
# Builds the local cluster's binaries from upstream Go modules into a cache outside the repository,
# keyed by component, version and the hash of the module files that pin it. A warm cache costs nothing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/versions.env"
cache=${PGOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pg-operator}
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
# What to build: component names (kubernetes etcd kwok coredns kube-router helm), profiles (kwok: what
# the kwok profile runs; full: what the full profile runs; all: everything, the tests' helm included), or
# a mix, as arguments or in PGOP_BINARIES (space-separated; the arguments win). Default: all.
#   localkube/build-binaries.sh full              # what `make demo` needs, no helm and no kwok
#   PGOP_BINARIES=full python3 localkube/cluster.py up full
#   localkube/build-binaries.sh --print full      # only print what would be built
print_only=0
if [ "${1:-}" = --print ]; then print_only=1; shift; fi
profile_components() {
  case "$1" in
    all) echo kubernetes etcd kwok coredns kube-router helm ;;
    kwok) echo kubernetes etcd kwok ;;
    full) echo kubernetes etcd coredns kube-router ;;
    kubernetes|etcd|coredns|kube-router|helm) echo "$1" ;;
    *) echo "build-binaries.sh: unknown component or profile '$1' (kubernetes, etcd, kwok, coredns," \
         "kube-router, helm; profiles kwok, full, all)" >&2; return 1 ;;
  esac
}
[ $# -gt 0 ] || set -- ${PGOP_BINARIES:-all}
wanted=" "
for w in "$@"; do
  # "kwok" alone names the profile, which includes the kwok binary.
  wanted+="$(profile_components "$w") "
done
wants() { [[ "$wanted" == *" $1 "* ]]; }
if [ "$print_only" = 1 ]; then
  printf '%s\n' $wanted | awk '!seen[$0]++' | paste -sd' '
  exit 0
fi
# One build at a time per cache: a second run started meanwhile (another checkout's tests, say) would
# otherwise clear the first one's half-built directory; it waits, then finds the cache warm.
mkdir -p "$cache"
exec 9>"$cache/.build.lock"
flock 9

# key DIR -> short hash of a module's go.mod and go.sum, so a changed pin means a new cache entry
key() { cat "$1/go.mod" "$1/go.sum" | sha256sum | cut -c1-12; }

build_group() {  # build_group NAME VERSION MODULE_DIR LDFLAGS PKG...
  local name=$1 version=$2 mod=$3 ldflags=$4; shift 4
  local out="$cache/bin/$name-$version-$(key "$mod")"
  if [ -f "$out/.complete" ]; then
    echo "$name $version: cached in $out"
  else
    echo "$name $version: building $* (cold builds take many minutes)"
    local start=$SECONDS
    rm -rf "$out.tmp" && mkdir -p "$out.tmp"
    (cd "$mod" && go build -trimpath -ldflags "$ldflags" -o "$out.tmp/" "$@")
    # go names a binary after its package path: etcd's server module would land as "server"
    if [ -f "$out.tmp/server" ]; then mv "$out.tmp/server" "$out.tmp/etcd"; fi
    echo "$((SECONDS - start))" > "$out.tmp/.build-seconds"  # read by bench/bench_localkube.py
    touch "$out.tmp/.complete"
    rm -rf "$out" && mv "$out.tmp" "$out"
    echo "$name $version: built in $((SECONDS - start)) s"
  fi
  mkdir -p "$cache/current"
  for f in "$out"/*; do ln -sfn "$f" "$cache/current/$(basename "$f")"; done
  rm -f "$cache/current/server"
}

if wants kubernetes; then
  major=${KUBE_VERSION#v}; major=${major%%.*}
  minor=${KUBE_VERSION#v*.}; minor=${minor%%.*}
  ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor"
    ld="$ld -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  pkgs=()
  for c in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl; do
    pkgs+=("k8s.io/kubernetes/cmd/$c")
  done
  build_group kubernetes "$KUBE_VERSION" "$here/modules/kubernetes" "$ld" "${pkgs[@]}"
fi
if wants etcd; then
  build_group etcd "$ETCD_VERSION" "$here/modules/etcd" "-s -w" go.etcd.io/etcd/server/v3 go.etcd.io/etcd/etcdctl/v3
fi
if wants kwok; then
  build_group kwok "$KWOK_VERSION" "$here/modules/kwok" "-s -w" sigs.k8s.io/kwok/cmd/kwok
fi
if wants coredns; then
  # Cluster DNS for the full profile; the version is the one localkube/modules/coredns/go.mod pins.
  coredns_version=$(awk '$1 == "require" && $2 == "github.com/coredns/coredns" {print $3}' "$here/modules/coredns/go.mod")
  build_group coredns "$coredns_version" "$here/modules/coredns" "-s -w" .
fi
if wants kube-router; then
  # NetworkPolicy enforcement for the full profile (only kube-router's firewall controller runs; see
  # localkube/netpol.py); the version is the one localkube/modules/kube-router/go.mod pins.
  kr_version=$(awk '$1 == "github.com/cloudnativelabs/kube-router/v2" {print $2}' "$here/modules/kube-router/go.mod")
  build_group kube-router "$kr_version" "$here/modules/kube-router" \
    "-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$kr_version" \
    github.com/cloudnativelabs/kube-router/v2/cmd/kube-router
fi
if wants helm; then
  # The Helm chart's tests (charts/pg-operator) and the e2e tier's install; the version is the one
  # localkube/modules/helm/go.mod pins. The ldflags give `helm version` its release and tell `helm lint`
  # which Kubernetes minor to check API deprecations against (the client-go minor Helm is built with).
  helm_version=$(awk '$1 == "helm.sh/helm/v3" {print $2}' "$here/modules/helm/go.mod")
  helm_kube_minor=$(awk '$1 == "k8s.io/client-go" {split($2, v, "."); print v[2]}' "$here/modules/helm/go.mod")
  ld="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    ld="$ld -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$helm_kube_minor"
  done
  build_group helm "$helm_version" "$here/modules/helm" "$ld" helm.sh/helm/v3/cmd/helm
fi
