"""images/build.sh with buildah (Debian's package): the default PostgreSQL image built from its
Dockerfile on a base buildah can reach (here: the script's own debootstrapped Debian, the registry being
out of reach), then run: PostgreSQL and the instance entrypoint work as the image's user, and the image's
config is the one images/postgres/image.json states. Skipped only when buildah is not installed (`make
test` installs it). buildah caches every step by its inputs (--layers), so an unchanged tree rebuilds in
seconds; a cold build (base included) takes about two minutes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from harness.paths import REPO
from pg_operator.images import BUILT_VERSIONS

pytestmark = pytest.mark.skipif(shutil.which("buildah") is None, reason="buildah is not installed")

# A name of its own: the test never retags what someone built under the default names.
REGISTRY = "localhost/pg-operator-build-test"
VERSION = BUILT_VERSIONS["16"][0]
IMAGE = f"{REGISTRY}/postgres:{VERSION}"


def buildah(*args: str, timeout: float = 120) -> str:
    res = subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"buildah {' '.join(args)} failed:\n{res.stderr}"
    return res.stdout


@pytest.fixture(scope="module")
def built() -> str:
    env = {**os.environ, "REGISTRY": REGISTRY, "PUSH": "0"}
    res = subprocess.run([str(REPO / "images" / "build.sh"), f"postgres:{VERSION}"], env=env,
                         capture_output=True, text=True, timeout=1500)  # fmt: skip
    assert res.returncode == 0, f"images/build.sh failed:\n{res.stderr[-5000:]}"
    assert res.stdout.splitlines() == [f"built {IMAGE}"], res.stdout
    return IMAGE


@pytest.fixture
def container(built: str) -> Iterator[str]:
    name = buildah("from", "--pull=never", "--quiet", built).strip()
    yield name
    buildah("rm", name)


def test_the_built_image_runs_postgresql_and_the_entrypoint(container: str) -> None:
    version = buildah("run", "--user", "999:999", container, "--", "postgres", "--version")
    assert version.strip() == f"postgres (PostgreSQL) {VERSION}"
    # What the pods run: the instance entrypoint's modules and Patroni, from the image's venv.
    imports = "import pg_operator.instance, patroni, psycopg; print('imported')"
    assert buildah("run", container, "--", "/opt/pg-operator/bin/python", "-c", imports).strip() == "imported"
    assert buildah("run", container, "--", "id", "-u", "postgres").strip() == "999"


def test_the_image_config_is_image_json(built: str) -> None:
    meta = json.loads((REPO / "images" / "postgres" / "image.json").read_text())
    config = json.loads(buildah("inspect", "--type", "image", built))["OCIv1"]["config"]
    assert config["User"] == meta["user"]
    assert config["Entrypoint"] == meta["entrypoint"]
    assert config["WorkingDir"] == meta["workdir"]
    assert sorted(config["ExposedPorts"]) == sorted(meta["ports"])
    want_env = {k: v.replace("${PG_VERSION}", VERSION) for k, v in meta["env"].items()}
    assert dict(e.split("=", 1) for e in config["Env"]) == want_env


def test_a_bad_request_is_refused_naming_it() -> None:
    env = {**os.environ, "REGISTRY": REGISTRY}
    for argv, needle in ((["postgres:14.1"], "postgres:14.1 is not built by images/postgres/image.json"),
                         (["mysql"], "unknown image mysql")):  # fmt: skip
        res = subprocess.run([str(REPO / "images" / "build.sh"), *argv], env=env, capture_output=True,
                             text=True, timeout=60)  # fmt: skip
        assert res.returncode != 0 and needle in res.stderr, res.stderr
    res = subprocess.run([str(REPO / "images" / "build.sh"), "operator"], env={**env, "BASE": "scratch"},
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode != 0 and "BASE=scratch is not auto, dockerfile or debootstrap" in res.stderr
