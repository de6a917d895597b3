"""Where the pods' images come from: `run`'s image flags (and their environment fallbacks), the settings
they make, and the pods the builders render with them (images.py, docs/install.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from harness.objects import cluster_model as cluster
from pg_operator import images
from pg_operator.api.image_policy import AllowedRepositories
from pg_operator.cli.main import build_parser, image_options
from pg_operator.specs.pooler import children as pooler_children
from pg_operator.specs.statefulset import statefulset

REGISTRY = "registry.example.com:5000/db"
POOLED = {"pooler": {"instances": 2, "readOnly": True}}  # a read-write and a read-only Deployment


@pytest.fixture
def configured() -> Iterator[None]:
    """The settings of an install pulling from a private registry; the defaults again afterwards."""
    images.configure(images.ImageSettings(postgres_repository=f"{REGISTRY}/postgres",
                                          pooler_repository=f"{REGISTRY}/operator", pooler_tag="0.1.0-rc1",
                                          pull_secrets=("regcred", "mirror-cred")))  # fmt: skip
    yield
    images.configure(images.DEFAULT_SETTINGS)


def pod_specs(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o["spec"]["template"]["spec"] for o in objs if o["kind"] in ("StatefulSet", "Deployment")]


def test_the_defaults_are_the_local_builds() -> None:
    args = build_parser().parse_args(["run"])
    settings, allowed = image_options(args)
    assert settings == images.DEFAULT_SETTINGS
    assert settings.pooler_image == "localhost/pg-operator/operator:0.1.0"
    assert allowed == AllowedRepositories((images.DEFAULT_POSTGRES_REPOSITORY,))
    assert images.default_image("16") == "localhost/pg-operator/postgres:16.15"
    # Nothing to pull with: the pods carry no imagePullSecrets key at all (no template change).
    objs = [statefulset(cluster()), *pooler_children(cluster(**POOLED))]
    assert len(pod_specs(objs)) == 3
    assert all("imagePullSecrets" not in spec for spec in pod_specs(objs))


def test_the_flags_make_the_settings_and_allow_their_repository() -> None:
    args = build_parser().parse_args([
        "run", f"--postgres-image-repository={REGISTRY}/postgres",
        f"--pooler-image-repository={REGISTRY}/pgop", "--pooler-image-tag=0.2.0",
        "--image-pull-secrets= regcred,mirror-cred,regcred ",
    ])  # fmt: skip
    settings, allowed = image_options(args)
    assert settings == images.ImageSettings(f"{REGISTRY}/postgres", f"{REGISTRY}/pgop", "0.2.0",
                                            ("regcred", "mirror-cred"))  # fmt: skip
    assert settings.pooler_image == f"{REGISTRY}/pgop:0.2.0"
    # spec.image may pin a version of the install's own repository, and nothing else by default.
    assert allowed.allows(f"{REGISTRY}/postgres:16.13")
    assert not allowed.allows("localhost/pg-operator/postgres:16.13")
    # An explicit list wins.
    args = build_parser().parse_args(
        [
            "run",
            f"--postgres-image-repository={REGISTRY}/postgres",
            f"--allowed-image-repositories={REGISTRY}/",
        ]
    )
    assert image_options(args)[1].entries == (f"{REGISTRY}/",)


def test_the_environment_is_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PG_OPERATOR_POSTGRES_IMAGE_REPOSITORY", f"{REGISTRY}/pg")
    monkeypatch.setenv("PG_OPERATOR_POOLER_IMAGE_REPOSITORY", f"{REGISTRY}/op")
    monkeypatch.setenv("PG_OPERATOR_POOLER_IMAGE_TAG", "9.9.9")
    monkeypatch.setenv("PG_OPERATOR_IMAGE_PULL_SECRETS", "regcred")
    settings, _ = image_options(build_parser().parse_args(["run"]))
    assert settings == images.ImageSettings(f"{REGISTRY}/pg", f"{REGISTRY}/op", "9.9.9", ("regcred",))
    # A flag beats its variable.
    settings, _ = image_options(build_parser().parse_args(["run", "--image-pull-secrets="]))
    assert settings.pull_secrets == ()


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (
            ["--postgres-image-repository=registry.example.com/pg:16"],
            "--postgres-image-repository: 'registry",
        ),
        (["--postgres-image-repository=Registry/UPPER"], "--postgres-image-repository"),
        (["--pooler-image-repository=a/b@sha256:00"], "--pooler-image-repository"),
        (["--pooler-image-tag=:latest"], "--pooler-image-tag: ':latest'"),
        (["--image-pull-secrets=regcred,Bad_Name"], "--image-pull-secrets: 'Bad_Name' is not a Secret name"),
    ],
)
def test_bad_values_are_refused_naming_the_flag(argv: list[str], named: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", *argv])
    assert named in capsys.readouterr().err


def test_a_bad_environment_value_is_refused_naming_the_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PG_OPERATOR_IMAGE_PULL_SECRETS", "UPPER")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run"])
    assert "--image-pull-secrets: 'UPPER' is not a Secret name" in capsys.readouterr().err


@pytest.mark.usefixtures("configured")
def test_every_pod_the_builders_make_uses_the_configured_images_and_secrets() -> None:
    assert images.default_image("17") == f"{REGISTRY}/postgres:17.11"
    assert images.image_for("16.13") == f"{REGISTRY}/postgres:16.13"
    sts = statefulset(cluster())
    (instance,) = sts["spec"]["template"]["spec"]["containers"]
    assert instance["image"] == f"{REGISTRY}/postgres:16.15"
    poolers = pooler_children(cluster(**POOLED))
    deployments = [o for o in poolers if o["kind"] == "Deployment"]
    assert len(deployments) == 2
    for deployment in deployments:
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert container["image"] == f"{REGISTRY}/operator:0.1.0-rc1"
    for spec in pod_specs([sts, *poolers]):
        assert spec["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror-cred"}]
    # A cluster's own spec.image is its own choice; the pull secrets still apply to it.
    pinned = statefulset(cluster(image=f"{REGISTRY}/custom:16.15"))
    assert pinned["spec"]["template"]["spec"]["containers"][0]["image"] == f"{REGISTRY}/custom:16.15"
    assert pinned["spec"]["template"]["spec"]["imagePullSecrets"] == [
        {"name": "regcred"},
        {"name": "mirror-cred"},
    ]


def test_settings_refuse_what_is_not_a_reference() -> None:
    with pytest.raises(ValueError, match="--postgres-image-repository: 'a/b:1'"):
        images.ImageSettings(postgres_repository="a/b:1")
    assert images.parse_pull_secrets("", "--image-pull-secrets") == ()
    with pytest.raises(ValueError, match="--image-pull-secrets"):
        images.parse_pull_secrets("x" * 254, "--image-pull-secrets")


def test_the_pooler_default_is_the_operator_image_the_recipe_builds() -> None:
    import json

    from harness.paths import REPO

    meta = json.loads((REPO / "images" / "operator" / "image.json").read_text())
    assert meta["name"] == images.DEFAULT_POOLER_REPOSITORY
    assert meta["args"]["VERSION"][0] == images.DEFAULT_POOLER_TAG


def test_no_image_reference_is_written_outside_images_py() -> None:
    """Every pod's image comes from images.py, so the install's repositories reach them all (the major
    upgrade's included, which calls default_image); a literal elsewhere would bypass the flags."""
    from harness.paths import REPO

    src = REPO / "src" / "pg_operator"
    for path in src.rglob("*.py"):
        if path == src / "images.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            quoted_in_prose = "`" in code  # a docstring's example (api/image_policy.py), not a value
            assert "localhost/pg-operator/" not in code or quoted_in_prose, (
                f"{path.relative_to(REPO)}:{number}"
            )
