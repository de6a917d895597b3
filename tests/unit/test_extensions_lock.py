"""images/postgres/extensions.lock, what the PostgreSQL image compiles from Debian's source packages: every
line pins one file of the Debian archive by sha256 for majors the images build; pgvector is built for
every major; pgaudit for exactly the majors the API admits it on (its release line differs per major, so
one line per major); and the recipe fetches nothing else."""

from __future__ import annotations

import re
from pathlib import Path

from pg_operator.api.parameters import MISSING_LIBRARIES, PRELOADABLE_LIBRARIES
from pg_operator.images import SUPPORTED_MAJORS

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "images" / "postgres" / "extensions.lock"
RECIPE = REPO / "images" / "postgres" / "recipe.sh"


def entries() -> list[tuple[str, str, tuple[str, ...], str, str]]:
    out = []
    for line in LOCK.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, version, majors, source, sha256 = line.split()
        out.append((name, version, tuple(majors.split(",")), source, sha256))
    return out


def test_each_line_pins_one_archive_file_by_sha256() -> None:
    assert entries()
    for name, version, majors, source, sha256 in entries():
        assert re.fullmatch(r"[0-9a-f]{64}", sha256), (name, sha256)
        assert re.fullmatch(r"pool/main/[a-z0-9]+/[a-z0-9.+-]+/[a-z0-9.+~_-]+\.orig\.tar\.(gz|xz)", source), (
            source
        )
        assert f"_{version}.orig.tar" in source, (name, version, source)
        assert set(majors) <= set(SUPPORTED_MAJORS), majors


def test_pgvector_is_built_for_every_major_once() -> None:
    majors = [m for name, _, ms, _, _ in entries() if name == "pgvector" for m in ms]
    assert sorted(majors) == sorted(SUPPORTED_MAJORS)


def test_pgaudit_is_built_exactly_where_the_api_admits_preloading_it() -> None:
    assert "pgaudit" in PRELOADABLE_LIBRARIES
    lines = [ms for name, _, ms, _, _ in entries() if name == "pgaudit"]
    assert all(len(ms) == 1 for ms in lines), "a pgaudit release line serves one major"
    built = {m for ms in lines for m in ms}
    assert built == set(SUPPORTED_MAJORS) - set(MISSING_LIBRARIES["pgaudit"])


def test_the_recipe_checks_the_hash_and_builds_only_what_the_lock_names() -> None:
    recipe = RECIPE.read_text()
    assert "EXTENSIONS_LOCK=$BUILD_CONTEXT/images/postgres/extensions.lock" in recipe
    assert "hashlib.sha256(data).hexdigest()" in recipe and "got != expected" in recipe
    # The compiler is gone from the image: every package the build step installed is purged again.
    assert 'apt-get purge -y -qq $(comm -13 "$work/before" "$work/after")' in recipe
