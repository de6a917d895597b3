"""The one place that maps a PostgreSQL major version to the image the operator runs by default.

Images are built locally (see images/ and localkube/) and tagged with the exact PostgreSQL version they
contain, so a tag change is a real minor upgrade. A cluster may pin its own image in its spec.
"""

from __future__ import annotations

IMAGE_REPOSITORY = "localhost/pg-operator/postgres"

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


def image_for(version: str) -> str:
    """Image reference for an exact PostgreSQL version such as "16.13"."""
    return f"{IMAGE_REPOSITORY}:{version}"


def default_image(major: str) -> str:
    """The image a cluster of this major version runs unless it pins its own."""
    try:
        return image_for(BUILT_VERSIONS[major][0])
    except KeyError:
        raise ValueError(
            f"unsupported PostgreSQL major version {major!r}; supported: {SUPPORTED_MAJORS}"
        ) from None
