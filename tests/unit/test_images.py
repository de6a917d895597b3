"""The major → image map agrees with what the image recipe builds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pg_operator import images

IMAGE_JSON = Path(__file__).resolve().parents[2] / "images" / "postgres" / "image.json"


def test_built_versions_are_what_image_json_builds() -> None:
    meta = json.loads(IMAGE_JSON.read_text())
    built = sorted(v for versions in images.BUILT_VERSIONS.values() for v in versions)
    assert built == sorted(meta["args"]["PG_VERSION"])
    assert meta["name"] == images.IMAGE_REPOSITORY
    assert meta["tag"] == "${PG_VERSION}"
    for major, versions in images.BUILT_VERSIONS.items():
        assert all(v.split(".")[0] == major for v in versions)


def test_default_is_newest_minor_and_tags_are_exact() -> None:
    assert images.default_image("16") == "localhost/pg-operator/postgres:16.15"
    assert images.default_image("15") == "localhost/pg-operator/postgres:15.19"
    assert images.image_for("16.13") == "localhost/pg-operator/postgres:16.13"
    assert images.SUPPORTED_MAJORS == ("15", "16", "17", "18")
    assert images.default_image("17") == "localhost/pg-operator/postgres:17.11"
    assert images.default_image("18") == "localhost/pg-operator/postgres:18.6"


def test_unsupported_major_is_named() -> None:
    with pytest.raises(ValueError, match="unsupported PostgreSQL major version '14'"):
        images.default_image("14")


def test_image_json_and_dockerfile_agree() -> None:
    for name in ("postgres", "operator"):
        meta = json.loads((IMAGE_JSON.parents[1] / name / "image.json").read_text())
        dockerfile = (IMAGE_JSON.parents[1] / name / "Dockerfile").read_text()
        assert meta["user"] == "999:999"
        assert f"USER {meta['user']}" in dockerfile
        assert f"ENTRYPOINT {json.dumps(meta['entrypoint'])}" in dockerfile
        assert f"sh /build/{meta['recipe']}" in dockerfile
        assert f"PATH={meta['env']['PATH']}" in dockerfile


def test_the_recipe_installs_barman_cloud_where_the_commands_look() -> None:
    from pg_operator.backup.barman import DEFAULT_BIN_DIR

    recipe = (IMAGE_JSON.parent / "recipe.sh").read_text()
    assert "\nVENV=/opt/pg-operator\n" in recipe and DEFAULT_BIN_DIR == "/opt/pg-operator/bin"
    # barman-cloud comes from the venv's lock (tests/unit/test_supply_chain.py checks the lock itself).
    assert '"$VENV/bin/pip" install -q --require-hashes --no-deps -r "$PYTHON_LOCK"' in recipe
    assert "\nbarman==" in (IMAGE_JSON.parent / "requirements.lock").read_text()
    # The image's PATH reaches them too (the controller's execs call psql and barman-cloud by name).
    meta = json.loads(IMAGE_JSON.read_text())
    assert DEFAULT_BIN_DIR in meta["env"]["PATH"].split(":")
