"""The allow-list of image repositories for spec.image (api/image_policy.py)."""

from __future__ import annotations

import pytest

from pg_operator.api.image_policy import AllowedRepositories, image_refusal, refusal_is_news, repository_of
from pg_operator.images import IMAGE_REPOSITORY, default_image


@pytest.mark.parametrize(("image", "repository"), [
    ("localhost/pg-operator/postgres:16.15", "localhost/pg-operator/postgres"),
    ("registry.example.com:5000/team/postgres:16", "registry.example.com:5000/team/postgres"),
    ("registry.example.com:5000/team/postgres", "registry.example.com:5000/team/postgres"),
    ("postgres@sha256:" + "a" * 64, "postgres"),
    ("registry.example.com/postgres:16@sha256:" + "b" * 64, "registry.example.com/postgres"),
])  # fmt: skip
def test_the_repository_is_the_reference_without_tag_and_digest(image: str, repository: str) -> None:
    assert repository_of(image) == repository


def test_the_default_allows_the_operators_own_images_only() -> None:
    allowed = AllowedRepositories()
    assert allowed.entries == (IMAGE_REPOSITORY,)
    assert allowed.allows(default_image("16"))
    for image in ("postgres:16", "docker.io/library/postgres:16", f"{IMAGE_REPOSITORY}-evil:16",
                  f"{IMAGE_REPOSITORY}/sub:16", "localhost/pg-operator/operator:0.1.0",
                  f"evil.example.com/{IMAGE_REPOSITORY}:16"):  # fmt: skip
        assert not allowed.allows(image), image


def test_an_entry_ending_in_a_slash_admits_every_repository_under_it() -> None:
    allowed = AllowedRepositories.parse("registry.example.com/db/, localhost/pg-operator/postgres")
    assert allowed.allows("registry.example.com/db/postgres:16")
    assert allowed.allows("registry.example.com/db/team/postgres@sha256:" + "c" * 64)
    assert allowed.allows("localhost/pg-operator/postgres:17.11")
    assert not allowed.allows("registry.example.com/dbx/postgres:16")
    assert not allowed.allows("registry.example.com/db:16")


def test_the_flag_is_parsed_and_a_bad_entry_named() -> None:
    assert AllowedRepositories.parse(" a/b ,a/b,c/ ").entries == ("a/b", "c/")
    for text, named in (("", "names no repository"), (" , ", "names no repository"),
                        ("a/b:16", "'a/b:16'"), ("a/b@sha256:00", "'a/b@sha256:00'"),
                        ("A/B", "'A/B'"), ("a b", "'a b'")):  # fmt: skip
        with pytest.raises(ValueError, match="--allowed-image-repositories") as err:
            AllowedRepositories.parse(text)
        assert named in str(err.value)


def test_a_refusal_names_spec_image_and_the_list() -> None:
    allowed = AllowedRepositories()
    assert image_refusal(None, allowed) is None  # the operator's default image
    assert image_refusal(default_image("17"), allowed) is None
    refusal = image_refusal("evil.example.com/miner:1", allowed)
    assert refusal is not None
    reason, message = refusal
    assert reason == "ImageNotAllowed"
    assert "spec.image 'evil.example.com/miner:1'" in message and IMAGE_REPOSITORY in message


def test_the_warning_is_news_once_per_refusal() -> None:
    refusal = ("ImageNotAllowed", "spec.image 'x:1' is not allowed")

    def status(state: str, reason: str, message: str) -> dict[str, object]:
        return {"conditions": [{"type": "Degraded", "status": state, "reason": reason, "message": message}]}

    assert refusal_is_news(None, refusal)
    assert refusal_is_news(status("False", "AsExpected", ""), refusal)
    assert refusal_is_news(status("True", "StorageClassNotFound", "no class"), refusal)
    assert refusal_is_news(status("True", "ImageNotAllowed", "spec.image 'y:1' is not allowed"), refusal)
    assert not refusal_is_news(status("True", *refusal), refusal)


def test_the_operators_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from pg_operator.cli.main import build_parser, image_options

    # Unset: the install's own PostgreSQL repository (--postgres-image-repository).
    assert image_options(build_parser().parse_args(["run"]))[1] == AllowedRepositories()
    parsed = build_parser().parse_args(["run", "--allowed-image-repositories=registry.example.com/db/,a/b"])
    assert parsed.allowed_image_repositories.entries == ("registry.example.com/db/", "a/b")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--allowed-image-repositories=a/b:16"])
    assert "--allowed-image-repositories: 'a/b:16' is not an image repository" in capsys.readouterr().err
