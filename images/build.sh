#!/usr/bin/env bash
# Builds the images from their Dockerfiles with buildah (Debian's `buildah` package), optionally pushes
# them to a registry. Run as root from anywhere; docs/install.md says how to use the result.
#
#   images/build.sh [IMAGE...]     IMAGE: operator | postgres (every version of postgres/image.json) |
#                                  postgres:<exact version> (e.g. postgres:16.15) | all (the default)
#
# Environment:
#   REGISTRY   where the images are named: $REGISTRY/postgres:<version>, $REGISTRY/operator:<version>
#              (default localhost/pg-operator, the names the operator uses by default)
#   PUSH=1     push each image after building it (`buildah login $host` first, or REGISTRY_AUTH_FILE)
#   BASE       auto (default): the Dockerfile's FROM (debian:<suite>-slim by digest: bookworm for
#              postgres, trixie for the operator) when the registry answers, else a Debian minbase of
#              that suite of our own; dockerfile: always the FROM;
#              debootstrap: always our own (debootstrap from the Debian mirror, checked by apt's keys)
#   DEBIAN_MIRROR  the mirror debootstrap uses (default: the host's apt mirror for that suite, else
#              deb.debian.org); the base follows <suite>, <suite>-updates and <suite>-security
#              (DEBIAN_SECURITY_MIRROR, default the mirror's debian-security) and is upgraded when made
#   BUILD_CA   a CA bundle pip needs behind a TLS-intercepting proxy, passed as the build secret
#              `build-ca` (never in a layer); default: $PIP_CERT when set
#
# buildah caches every step (--layers): a rebuild with unchanged inputs reuses every layer, and the
# PostgreSQL versions share one base stage. Prints one line per image: `built <reference>`.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

REGISTRY=${REGISTRY:-localhost/pg-operator}
REGISTRY=${REGISTRY%/}
PUSH=${PUSH:-0}
BASE=${BASE:-auto}
BUILD_CA=${BUILD_CA:-${PIP_CERT:-}}
OWN_BASE=localhost/pg-operator/debian-minbase  # :<suite>

die() { echo "images/build.sh: $*" >&2; exit 1; }
command -v buildah >/dev/null || die "buildah is missing: apt-get install -y buildah"
case "$BASE" in auto|dockerfile|debootstrap) ;; *) die "BASE=$BASE is not auto, dockerfile or debootstrap" ;; esac
case "$PUSH" in 0|1) ;; *) die "PUSH=$PUSH is not 0 or 1" ;; esac
[ -z "$BUILD_CA" ] || [ -s "$BUILD_CA" ] || die "BUILD_CA=$BUILD_CA is not a file"

# image.json field of an image directory, e.g. `json images/postgres args.PG_VERSION`.
json() {
  python3 -c 'import json, sys
value = json.load(open(sys.argv[1] + "/image.json"))
for key in sys.argv[2].split("."):
    value = value[key]
print(" ".join(value) if isinstance(value, list) else value)' "$1" "$2"
}

host_mirror() {  # host_mirror SUITE
  local uri
  uri=$(awk -v s="$1" '/^URIs:/ {u=$2} /^Suites:/ && ($0 ~ " " s "( |$)") && u {print u; exit}' \
        /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [ -n "$uri" ] || uri=$(awk -v s="$1" '$1 == "deb" && $3 == s {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

# A Debian minbase of SUITE made here, as localkube's image builder makes its root filesystems: the
# same Debian the slim image is made from, without a registry. Built once per suite, then reused.
own_base() {  # own_base SUITE
  local suite=$1
  if buildah inspect --type image "$OWN_BASE:$suite" >/dev/null 2>&1; then
    return
  fi
  command -v debootstrap >/dev/null || die "debootstrap is missing: apt-get install -y debootstrap"
  local root ctr
  root=$(mktemp -d /var/tmp/pg-operator-base.XXXXXX)
  trap 'rm -rf "$root" "$root.tar"' EXIT
  local mirror=${DEBIAN_MIRROR:-$(host_mirror "$suite")}
  echo "base: debootstrap --variant=minbase $suite from $mirror" >&2
  debootstrap --variant=minbase "$suite" "$root" "$mirror" >/dev/null
  # The suites the slim image follows too: the point release, its updates and the security archive.
  printf 'deb %s %s main\ndeb %s %s-updates main\ndeb %s %s-security main\n' "$mirror" "$suite" "$mirror" "$suite" \
    "${DEBIAN_SECURITY_MIRROR:-${mirror%/debian}/debian-security}" "$suite" > "$root/etc/apt/sources.list"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*.log
  : > "$root/etc/resolv.conf"  # the runtime mounts its own
  tar -C "$root" -cf "$root.tar" .
  ctr=$(buildah from scratch)
  buildah add --quiet "$ctr" "$root.tar" / >/dev/null  # an archive is unpacked
  buildah run --network=host "$ctr" -- sh -c 'export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get upgrade -y -qq >/dev/null && apt-get clean && rm -rf /var/lib/apt/lists/*' >&2
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd /bin/bash \
    --label org.opencontainers.image.title="Debian $suite minbase (images/build.sh)" "$ctr"
  buildah commit --quiet --rm "$ctr" "$OWN_BASE:$suite" >/dev/null
  rm -rf "$root" "$root.tar"
  trap - EXIT
}

# The base for a Dockerfile: nothing (its own FROM) or `--from <our base of the FROM's suite>`.
base_args() {
  local from suite
  from=$(awk 'toupper($1) == "FROM" {print $2; exit}' "$1")
  if [ "$BASE" = dockerfile ]; then return; fi
  if [ "$BASE" = auto ] && timeout 120 buildah pull --quiet "$from" >/dev/null 2>&1; then return; fi
  # debian:<suite>-slim@sha256:… → <suite>
  suite=$(printf '%s\n' "$from" | sed -n 's|^debian:\([a-z][a-z]*\)-slim@.*|\1|p')
  [ -n "$suite" ] || die "$1: FROM $from is not debian:<suite>-slim@sha256:…; use BASE=dockerfile"
  own_base "$suite"
  echo "--from=$OWN_BASE:$suite"
}

build() {  # build DIR REFERENCE [--build-arg …]
  local dir=$1 ref=$2; shift 2
  local args=(--layers --force-rm --network=host --format=oci -f "$dir/Dockerfile" --ignorefile "$dir/Dockerfile.dockerignore")
  local base
  base=$(base_args "$dir/Dockerfile")
  [ -z "$base" ] || args+=("$base")
  [ -z "$BUILD_CA" ] || args+=(--secret "id=build-ca,src=$BUILD_CA")
  echo "building $ref" >&2
  buildah bud "${args[@]}" "$@" -t "$ref" "$repo" >&2
  if [ "$PUSH" = 1 ]; then
    buildah push --quiet "$ref" "docker://$ref" >&2
  fi
  echo "built $ref"
}

postgres() {  # postgres VERSION
  local versions
  versions=" $(json images/postgres args.PG_VERSION) "
  [[ "$versions" == *" $1 "* ]] || die "postgres:$1 is not built by images/postgres/image.json (versions:$versions)"
  build images/postgres "$REGISTRY/postgres:$1" --build-arg "PG_VERSION=$1"
}

operator() {
  build images/operator "$REGISTRY/operator:$(json images/operator args.VERSION)"
}

[ $# -gt 0 ] || set -- all
for want in "$@"; do
  case "$want" in
    all) operator; for v in $(json images/postgres args.PG_VERSION); do postgres "$v"; done ;;
    operator) operator ;;
    postgres) for v in $(json images/postgres args.PG_VERSION); do postgres "$v"; done ;;
    postgres:*) postgres "${want#postgres:}" ;;
    *) die "unknown image $want (operator, postgres, postgres:<version>, all)" ;;
  esac
done
