"""The install's allow-list of image repositories for `spec.image` (the operator's
`--allowed-image-repositories`).

`spec.image` is a field a tenant sets, and the instance pods run what it names under the cluster's
ServiceAccount: without a list, a tenant who may not create pods could still run any image. The list is
the platform admin's, given at install time; a cluster whose image is outside it is refused (a
condition naming `spec.image` and a Warning Event) before anything is written for it.

An entry matches an image whose repository (the reference less its tag and digest) is the entry itself,
or, for an entry ending in "/", any repository under it. Plain prefixes are not enough:
`localhost/pg-operator/postgres` must not admit `localhost/pg-operator/postgres-anything`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pg_operator import objects
from pg_operator.images import IMAGE_REPOSITORY

# What the refusal is reported as (the Degraded condition's reason and the Warning Event's).
REFUSED_REASON = "ImageNotAllowed"

# A repository as an image reference spells it: lower-case path components separated by "/", an
# optional registry host (with a port) first. Checked so a typo in the flag fails at start, naming it.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]+)?"
_REPOSITORY = re.compile(rf"^(?:{_HOST}/)?{_COMPONENT}(?:/{_COMPONENT})*/?$")


@dataclass(frozen=True)
class AllowedRepositories:
    """The repositories (exact) and the repository prefixes (ending in "/") spec.image may name."""

    entries: tuple[str, ...] = (IMAGE_REPOSITORY,)

    @classmethod
    def parse(cls, text: str) -> AllowedRepositories:
        """From the flag's comma-separated value; raises ValueError naming the bad entry."""
        entries = tuple(dict.fromkeys(e.strip() for e in text.split(",") if e.strip()))
        if not entries:
            raise ValueError("--allowed-image-repositories names no repository")
        for entry in entries:
            if not _REPOSITORY.match(entry):
                raise ValueError(
                    f"--allowed-image-repositories: {entry!r} is not an image repository "
                    "(e.g. registry.example.com/postgres, or registry.example.com/team/ for every "
                    "repository under it; no tag, no digest)"
                )
        return cls(entries)

    def allows(self, image: str) -> bool:
        repository = repository_of(image)
        return any(
            repository.startswith(entry) if entry.endswith("/") else repository == entry
            for entry in self.entries
        )

    def __str__(self) -> str:
        return ", ".join(self.entries)


# The operator's default: its own PostgreSQL images only.
DEFAULT_ALLOWED_REPOSITORIES = AllowedRepositories()


def repository_of(image: str) -> str:
    """The repository of an image reference: without its digest ("@sha256:…") and its tag (a ":" after
    the last "/", so a registry's port stays)."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name


def image_refusal(image: str | None, allowed: AllowedRepositories) -> tuple[str, str] | None:
    """(reason, message) when `spec.image` names a repository outside the allow-list; None when it is
    unset (the operator's default image) or allowed."""
    if image is None or allowed.allows(image):
        return None
    return (
        REFUSED_REASON,
        f"spec.image {image!r} is not in a repository this operator may run (allowed: {allowed}); "
        "nothing is changed for this cluster until spec.image names one (existing pods keep running)",
    )


def refusal_is_news(previous_status: Mapping[str, Any] | None, refusal: tuple[str, str]) -> bool:
    """Whether the status does not yet say this refusal (Degraded=True with its reason and message): its
    Warning Event is posted once, not on every reconcile that refuses the same image again."""
    degraded = objects.condition(previous_status, "Degraded") or {}
    said = (degraded.get("status"), degraded.get("reason"), degraded.get("message"))
    return said != ("True", *refusal)
