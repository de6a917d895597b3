"""The one place that maps a PostgreSQL major version to the image the operator runs by default, and
where those images come from.

Images are built from images/ and tagged with the exact PostgreSQL version they contain, so a tag change
is a real minor upgrade. A cluster may pin its own image in its spec.

Where the images live is the install's choice (`--postgres-image-repository`,
`--pooler-image-repository`, `--image-pull-secrets`, docs/install.md): the operator process sets it once
at start (`configure`), before any reconcile, and the builders read it as they read a constant. The
default is the local build's repositories, which the local cluster imports without a registry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_POSTGRES_REPOSITORY = "localhost/pg-operator/postgres"
# The name image.json gives the PostgreSQL images (a unit test keeps the two equal); the default above.
IMAGE_REPOSITORY = DEFAULT_POSTGRES_REPOSITORY
# The pooler's pods run PgBouncer from the operator's own image (images/operator), of the same version.
DEFAULT_POOLER_REPOSITORY = "localhost/pg-operator/operator"
DEFAULT_POOLER_TAG = "0.1.0"

# Exact PostgreSQL versions that the image recipe builds (images/postgres/image.json, args.PG_VERSION; a
# unit test keeps the two equal), newest minor first for each major: the first is the major's default.
# The keys are also the majors the CRD accepts in spec.version (its enum is generated from them), so add a
# major here only once its image ships.
BUILT_VERSIONS: dict[str, tuple[str, ...]] = {
    "15": ("15.19",),
    "16": ("16.15", "16.13"),
    "17": ("17.11",),
    "18": ("18.6",),
}

SUPPORTED_MAJORS: tuple[str, ...] = tuple(BUILT_VERSIONS)

# A repository as an image reference spells it: lower-case path components separated by "/", an
# optional registry host (with a port) first; no tag, no digest.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]+)?"
_REPOSITORY = re.compile(rf"(?:{_HOST}/)?{_COMPONENT}(?:/{_COMPONENT})*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
# A Secret's name: a DNS subdomain (RFC 1123), at most 253 characters.
_SECRET_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def check_repository(value: str, field: str) -> str:
    """`value` when it is an image repository; ValueError naming `field` otherwise."""
    if not _REPOSITORY.fullmatch(value):
        raise ValueError(
            f"{field}: {value!r} is not an image repository (e.g. registry.example.com/pg/postgres; "
            "no tag, no digest)"
        )
    return value


def check_tag(value: str, field: str) -> str:
    if not _TAG.fullmatch(value):
        raise ValueError(f"{field}: {value!r} is not an image tag (letters, digits, '_', '.', '-')")
    return value


def parse_pull_secrets(text: str, field: str) -> tuple[str, ...]:
    """Secret names from a comma-separated list ("" for none); ValueError naming `field` and the name."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    for name in names:
        if len(name) > 253 or not _SECRET_NAME.fullmatch(name):
            raise ValueError(f"{field}: {name!r} is not a Secret name (lower-case DNS subdomain)")
    return names


@dataclass(frozen=True)
class ImageSettings:
    """Where the images of the pods the operator makes come from."""

    # PostgreSQL images: <postgres_repository>:<exact PostgreSQL version>.
    postgres_repository: str = DEFAULT_POSTGRES_REPOSITORY
    pooler_repository: str = DEFAULT_POOLER_REPOSITORY
    pooler_tag: str = DEFAULT_POOLER_TAG
    # Names of Secrets (type kubernetes.io/dockerconfigjson) in each cluster's own namespace, put in the
    # imagePullSecrets of every pod the operator makes there.
    pull_secrets: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_repository(self.postgres_repository, "--postgres-image-repository")
        check_repository(self.pooler_repository, "--pooler-image-repository")
        check_tag(self.pooler_tag, "--pooler-image-tag")

    @property
    def pooler_image(self) -> str:
        return f"{self.pooler_repository}:{self.pooler_tag}"


DEFAULT_SETTINGS = ImageSettings()
_configured = DEFAULT_SETTINGS


def configure(settings: ImageSettings) -> None:
    """Set the process's image settings; the operator calls it once at start, before any reconcile."""
    global _configured  # set once at start, then only read
    _configured = settings


def configured() -> ImageSettings:
    return _configured


def image_for(version: str) -> str:
    """Image reference for an exact PostgreSQL version such as "16.13"."""
    return f"{_configured.postgres_repository}:{version}"


def default_image(major: str) -> str:
    """The image a cluster of this major version runs unless it pins its own."""
    try:
        return image_for(BUILT_VERSIONS[major][0])
    except KeyError:
        raise ValueError(
            f"unsupported PostgreSQL major version {major!r}; supported: {SUPPORTED_MAJORS}"
        ) from None


def pooler_image() -> str:
    """The image of the pooler's pods (PgBouncer and its supervisor: the operator's image)."""
    return _configured.pooler_image


def image_pull_secrets() -> list[dict[str, str]]:
    """The pod spec's imagePullSecrets for every pod the operator makes; empty when none are set (then
    the key is left out, so an install without them renders the pods exactly as before)."""
    return [{"name": name} for name in _configured.pull_secrets]
