#!/bin/sh
# The operator: a Python venv with this project's package, run as uid 999 under tini. Run as root inside a
# Debian trixie root filesystem, by images/operator/Dockerfile and by localkube's image builder alike
# (contract: images/README.md). Trixie, not bookworm: the pooler's pods run this image too, and PgBouncer
# needs >= 1.21 for protocol-level prepared statements (drivers at their defaults; docs/pooler.md).
#
# Environment: BUILD_CONTEXT — where the repository was copied (default /build).
set -eu

BUILD_CONTEXT=${BUILD_CONTEXT:-/build}
VENV=/opt/pg-operator
export DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

step() { echo "recipe[operator]: $*"; }

step "user pg-operator (999:999)"
getent group pg-operator >/dev/null || groupadd --system --gid 999 pg-operator
getent passwd pg-operator >/dev/null || useradd --system --uid 999 --gid 999 \
  --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin --comment "pg-operator" pg-operator
[ "$(id -u pg-operator):$(id -g pg-operator)" = "999:999" ] || { echo "recipe: pg-operator is not 999:999" >&2; exit 1; }

step "Debian packages"
cat > /etc/dpkg/dpkg.cfg.d/01-pg-operator-nodoc <<'CFG'
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
path-exclude=/usr/share/lintian/*
CFG
# See images/postgres/recipe.sh: a builder-supplied CA bundle is kept for pip during the build.
BUILD_CA=/run/pg-operator-build-ca.crt
# An OCI builder passes it as the build secret `build-ca` (images/build.sh; `--secret id=build-ca,src=…`),
# mounted for the RUN step only, so no layer holds it.
if [ -s /run/secrets/build-ca ] && [ -z "${PIP_CERT:-}" ]; then
  export PIP_CERT=/run/secrets/build-ca
elif [ -s /etc/ssl/certs/ca-certificates.crt ] && [ -z "${PIP_CERT:-}" ]; then
  mkdir -p /run && cp /etc/ssl/certs/ca-certificates.crt "$BUILD_CA" && export PIP_CERT="$BUILD_CA"
fi
apt-get update -qq
# tini is PID 1: Python as PID 1 gets no default SIGTERM handling and would not reap orphans.
# pgbouncer: the pooler's pods run this image too (pg-operator-pooler supervises it; docs/pooler.md).
apt-get install -y -qq --no-install-recommends ca-certificates tini python3 python3-venv pgbouncer >/dev/null
# Debian's package starts nothing here (no init system); its default config and logs are not used.
[ -x /usr/sbin/pgbouncer ] || { echo "recipe: /usr/sbin/pgbouncer is missing" >&2; exit 1; }
# pgbouncer.ini sets max_prepared_statements, which PgBouncer knows from 1.21 on: refuse an image with
# an older one (this recipe run on the wrong Debian release).
pgbouncer_version=$(/usr/sbin/pgbouncer --version | sed -n '1s/^PgBouncer \([0-9][0-9]*\)\.\([0-9][0-9]*\).*/\1 \2/p')
set -- $pgbouncer_version
[ "$#" -eq 2 ] && { [ "$1" -gt 1 ] || { [ "$1" -eq 1 ] && [ "$2" -ge 21 ]; }; } || {
  echo "recipe: PgBouncer >= 1.21 is needed, $(/usr/sbin/pgbouncer --version | head -1) is installed" >&2; exit 1; }
step "PgBouncer $1.$2"

step "venv $VENV with pg-operator"
python3 -m venv "$VENV"
# Exactly the lock (every package pinned, every file checked against its recorded hashes, nothing
# resolved here), then the project itself built with the lock's setuptools and nothing from the index.
"$VENV/bin/pip" install -q --require-hashes --no-deps -r "$BUILD_CONTEXT/images/operator/requirements.lock"
"$VENV/bin/pip" install -q --no-deps --no-build-isolation --no-index "$BUILD_CONTEXT"
"$VENV/bin/pip" check >/dev/null || { "$VENV/bin/pip" check >&2; echo "recipe: the lock misses a dependency" >&2; exit 1; }
"$VENV/bin/python" -c "import pg_operator.controller.operator, lightkube, aiohttp"
[ -x "$VENV/bin/pg-operator" ] || { echo "recipe: $VENV/bin/pg-operator is missing" >&2; exit 1; }
[ -x "$VENV/bin/pg-operator-pooler" ] || { echo "recipe: $VENV/bin/pg-operator-pooler is missing" >&2; exit 1; }

step "clean up"
"$VENV/bin/python" -m pip uninstall -y -q pip setuptools
apt-get clean
rm -f "$BUILD_CA"
rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/cache/debconf/*-old /var/log/apt/* /var/log/dpkg.log \
  /root/.cache /tmp/* /tmp/.[!.]* /usr/share/man/* /usr/share/info/* /usr/share/locale/*
find /usr/share/doc -mindepth 1 ! -type d ! -name copyright -delete
step "done"
