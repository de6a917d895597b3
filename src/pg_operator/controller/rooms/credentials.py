"""The credentials room: the cluster's Secrets (application, superuser, replication, Patroni API),
created once with passwords from a CSPRNG and never overwritten by the operator."""

from __future__ import annotations

import logging
from typing import Any

from lightkube.core.exceptions import ApiError

from pg_operator.controller.kube_api import Api, is_conflict
from pg_operator.controller.rooms import ClusterPass, Room
from pg_operator.controller.writes import WriteMemo, all_of
from pg_operator.specs import ClusterPasswords, build_secrets, secret_names

log = logging.getLogger(__name__)


class CredentialsRoom(Room):
    def __init__(self, api: Api, memo: WriteMemo) -> None:
        self.api = api
        self.memo = memo

    async def create(self, p: ClusterPass) -> int:
        names = secret_names(p.cluster)
        p.wanted.update(("v1", "Secret", n) for n in names)
        missing = [n for n in names if p.snapshot.find("v1", "Secret", n) is None]
        for present in set(names) - set(missing):
            self.memo.seen((p.namespace, "Secret", present, "create"))
        missing = [
            n for n in missing if not self.memo.pending((p.namespace, "Secret", n, "create"), None, "")
        ]
        if not missing:
            return 0

        async def create(secret: dict[str, Any]) -> int:
            secret_name = secret["metadata"]["name"]
            log.info("creating Secret %s/%s", p.namespace, secret_name)
            try:
                await self.api.create_dict(secret)
            except ApiError as exc:
                if not is_conflict(exc):  # already there (the cache had not caught up): create-only
                    raise
            self.memo.wrote((p.namespace, "Secret", secret_name, "create"), None, "")
            return 1

        # Passwords only exist in these objects and in the request body; never logged.
        secrets = build_secrets(p.cluster, ClusterPasswords.generate())
        return await all_of([create(s) for s in secrets if s["metadata"]["name"] in missing])
