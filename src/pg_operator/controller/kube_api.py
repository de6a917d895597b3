"""Connection to the API server (the way kubectl finds it) and the one write path of the controller.

Every request the controller makes goes through `Api`, which counts it by verb for the metrics; the
informers' lists and watches (controller/informer.py) go through an `Api` of their own, so a burst of
writes never holds up the stream of events.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx2
from lightkube import AsyncClient, KubeConfig, codecs
from lightkube.config.client_adapter import verify_cluster
from lightkube.core.exceptions import ApiError
from lightkube.core.resource import NamespacedResource, api_info
from lightkube.core.resource_registry import resource_registry
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.authorization_v1 import ResourceAttributes, SelfSubjectAccessReviewSpec
from lightkube.resources.authorization_v1 import SelfSubjectAccessReview
from lightkube.types import CascadeType, PatchType

from pg_operator.api.constants import FIELD_MANAGER, GROUP, KIND, PLURAL, VERSION
from pg_operator.controller.metrics import Metrics

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

PostgresClusterResource = create_namespaced_resource(GROUP, VERSION, KIND, PLURAL)


def kubeconfig_path() -> Path | None:
    """The kubeconfig kubectl would read: the first existing file of $KUBECONFIG, else ~/.kube/config."""
    env = os.environ.get("KUBECONFIG")
    candidates = [p for p in env.split(os.pathsep) if p] if env else ["~/.kube/config"]
    for candidate in candidates:
        path = Path(candidate).expanduser()
        if path.is_file():
            return path
    return None


def load_config() -> KubeConfig:
    path = kubeconfig_path()
    if path is not None:
        return KubeConfig.from_file(path)
    if (SERVICE_ACCOUNT_DIR / "token").is_file():
        return KubeConfig.from_service_account(SERVICE_ACCOUNT_DIR)
    raise SystemExit("no kubeconfig ($KUBECONFIG, ~/.kube/config) and no in-cluster service account found")


def resource_for(api_version: str, kind: str) -> type[Any]:
    if (api_version, kind) == (f"{GROUP}/{VERSION}", KIND):
        return PostgresClusterResource
    return resource_registry.load(api_version, kind)


# The resourceVersion of a create-only apply (Api.apply): no live object has it.
CREATE_ONLY_VERSION = "1"


def list_path(res: type[Any], namespace: str | None) -> str:
    """The URL path listing a kind (in `namespace` when it is namespaced)."""
    info = api_info(res).resource
    base = f"/api/{info.version}" if not info.group else f"/apis/{info.group}/{info.version}"
    if namespace is not None and issubclass(res, NamespacedResource):
        base += f"/namespaces/{namespace}"
    return f"{base}/{api_info(res).plural}"


def is_not_found(exc: ApiError) -> bool:
    return exc.status.code == 404


def is_conflict(exc: ApiError) -> bool:
    return exc.status.code == 409


# Requests one Api has in flight at most. A reconcile sends a new cluster's children together and the
# workers do so at once: at 1000 new clusters, 20 in flight left the API server idle between answers
# (the operator sent 34-43 requests a second where a client with more in flight sent 63).
MAX_IN_FLIGHT = 64

# A list of metadata only; plain JSON if the server cannot (each item's `metadata` is the same).
METADATA_ACCEPT = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
METADATA_PAGE = 500


def pooled_transport(
    config: KubeConfig, *, http2: bool = True, connections: int | None = MAX_IN_FLIGHT
) -> httpx2.AsyncHTTPTransport:
    """HTTP/2 where the API server offers it (it does, as client-go uses it): every request in flight
    on one connection. At 1000 new clusters, 64 HTTP/1.1 connections held 2-3 MiB more than one, and
    finding a free one among them was an eighth of the operator's CPU (the pool probes every idle
    socket on each request). Should HTTP/2 be refused, the HTTP/1.1 pool keeps a connection for every
    request in flight: with the default (20 kept), each burst above it would open, and then close, TLS
    connections of its own.

    Watches take HTTP/1.1 and a connection each (`http2=False, connections=None`): over one HTTP/2
    connection the client reads the socket for one stream at a time, and a watch waiting for its next
    event kept the events of the others from being read (with 21 watches, none arrived)."""
    single = config.get()
    if single is None or single.user is None:
        raise SystemExit("the kubeconfig names no current context with a user")
    limits = httpx2.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx2.AsyncHTTPTransport(verify=verify_cluster(single.cluster, single.user, single.abs_file),
                                     limits=limits, http2=http2)  # fmt: skip


class HttpStatusError(RuntimeError):
    """The API server answered a raw request with an error status (`code`)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _raise_for_status(resp: Any) -> None:
    if resp.status_code >= 400:
        raise HttpStatusError(resp.status_code, f"{resp.request.method} {resp.request.url.path}: "
                              f"HTTP {resp.status_code}: {resp.text[:200]}")  # fmt: skip


# A watch request's own end (the API server closes it after this long) and how long its stream may stay
# silent before the client gives up on it: bookmarks and events keep a live one busy.
WATCH_SECONDS = 300
WATCH_READ_TIMEOUT = WATCH_SECONDS + 30.0


class Api:
    """The controller's client: lightkube async, one field manager, requests counted by verb.
    `for_watches`: the informers' client (pooled_transport says why it differs)."""

    def __init__(self, metrics: Metrics, config: KubeConfig | None = None, *,
                 for_watches: bool = False) -> None:  # fmt: skip
        config = config or load_config()
        transport = (pooled_transport(config, http2=False, connections=None) if for_watches
                     else pooled_transport(config))  # fmt: skip
        self.client = AsyncClient(config, field_manager=FIELD_MANAGER, transport=transport)
        self._metrics = metrics
        self._slots = asyncio.Semaphore(MAX_IN_FLIGHT)

    def _count(self, verb: str) -> None:
        self._metrics.api_requests.labels(verb=verb).inc()

    async def close(self) -> None:
        await self.client.close()

    def _http(self) -> Any:
        # lightkube's HTTP client (base URL, TLS, auth): lightkube has no metadata-only request.
        return self.client._client._client

    async def list_metadata(
        self, path: str, params: Mapping[str, str], page_size: int = METADATA_PAGE
    ) -> AsyncIterator[list[dict[str, Any]]]:
        """The metadata of every object at `path` (a list URL), a page at a time: the API server sends
        PartialObjectMetadata, not whole objects."""
        query = {**params, "limit": str(page_size)}
        while True:
            self._count("list")
            async with self._slots:
                resp = await self._http().get(path, params=query, headers={"Accept": METADATA_ACCEPT})
            _raise_for_status(resp)
            listing = resp.json()
            yield [item.get("metadata") or {} for item in listing.get("items") or ()]
            token = (listing.get("metadata") or {}).get("continue")
            if not token:
                return
            query["continue"] = token

    async def list_page(self, path: str, params: Mapping[str, str]) -> dict[str, Any]:
        """One page of a list, whole objects, as the API server's JSON."""
        self._count("list")
        resp = await self._http().get(path, params=dict(params))
        _raise_for_status(resp)
        page = resp.json()
        if not isinstance(page, dict):
            raise HttpStatusError(resp.status_code, f"GET {path}: not a list")
        return page

    @contextlib.asynccontextmanager
    async def watch(self, path: str, params: Mapping[str, str]) -> AsyncIterator[httpx2.Response]:
        """A watch of the list at `path` (params carry resourceVersion, selectors), as a streamed response
        whose lines are events. Not among the requests in flight: a watch lasts minutes."""
        self._count("watch")
        query = {**params, "watch": "true", "allowWatchBookmarks": "true",
                 "timeoutSeconds": str(WATCH_SECONDS)}  # fmt: skip
        timeout = httpx2.Timeout(10.0, read=WATCH_READ_TIMEOUT)
        async with self._http().stream("GET", path, params=query, timeout=timeout) as resp:
            if resp.status_code >= 400:
                await resp.aread()
                _raise_for_status(resp)
            yield resp

    async def get(self, res: type[Any], name: str, namespace: str | None = None) -> Any:
        self._count("get")
        async with self._slots:
            return await self.client.get(res, name, namespace=namespace)

    async def create(self, obj: Any) -> Any:
        self._count("create")
        async with self._slots:
            return await self.client.create(obj)

    async def replace(self, obj: Any) -> Any:
        self._count("update")
        async with self._slots:
            return await self.client.replace(obj)

    async def apply(self, body: Mapping[str, Any], *, uid: str | None = None,
                    create_only: bool = False) -> Any:  # fmt: skip
        """Server-side apply of a complete object (dict), forcing ownership of the fields we set.

        Never over an object that is not the one meant (controller/writes.py), by preconditions the API
        server checks (tests/integration/test_ownership_conflict.py shows each on it):
        - `uid`: the object this must be. `metadata.uid` in an apply body is compared with the stored
          object's: another object under the name is refused (422, uid is immutable), none at all too
          (409 "uid mismatch ... no existing object was found"): such an apply neither takes over nor
          creates.
        - `create_only`: create, or nothing. `metadata.resourceVersion` "1" is a version no object of a
          running cluster has (etcd's first revision went to the API server's own bootstrap), so an
          existing object refuses the apply (409) whatever `force` says, while a create ignores it. Unlike
          a POST, the object then carries an apply's field manager entry: later applies remove what
          they stop setting (a POST's entry would co-own every field and keep them)."""
        meta = body["metadata"]
        res = resource_for(body["apiVersion"], body["kind"])
        namespace = meta.get("namespace") if issubclass(res, NamespacedResource) else None
        payload = dict(body)
        if uid is not None:
            payload["metadata"] = {**meta, "uid": uid}
        elif create_only:
            payload["metadata"] = {**meta, "resourceVersion": CREATE_ONLY_VERSION}
        self._count("apply")
        async with self._slots:
            return await self.client.patch(
                res,
                meta["name"],
                payload,
                namespace=namespace,
                patch_type=PatchType.APPLY,
                field_manager=FIELD_MANAGER,
                force=True,
            )

    async def create_dict(self, body: Mapping[str, Any]) -> Any:
        """POST: fails with 409 when any object holds the name."""
        self._count("create")
        async with self._slots:
            return await self.client.create(codecs.from_dict(dict(body)))

    async def find_metadata(
        self, api_version: str, kind: str, name: str, namespace: str | None
    ) -> dict[str, Any] | None:
        """The metadata of the object under `name`, or None: a list with a field selector, since the
        operator may list every kind it writes but get only a few (deploy/operator/rbac.yaml)."""
        path = list_path(resource_for(api_version, kind), namespace)
        async for page in self.list_metadata(path, {"fieldSelector": f"metadata.name={name}"}):
            for meta in page:
                if meta.get("name") == name:
                    return meta
        return None

    async def merge_patch(
        self,
        res: type[Any],
        name: str,
        namespace: str | None,
        patch: Mapping[str, Any],
        *,
        subresource_status: bool = False,
    ) -> Any:
        self._count("patch")
        async with self._slots:
            return await self.client.patch(
                res.Status if subresource_status else res,
                name,
                dict(patch),
                namespace=namespace,
                patch_type=PatchType.MERGE,
                field_manager=FIELD_MANAGER,
            )

    async def delete(self, api_version: str, kind: str, name: str, namespace: str | None, *,
                     uid: str | None = None, grace_period_seconds: int | None = None) -> None:  # fmt: skip
        """Delete in the background. `uid`: a precondition (DeleteOptions), so an object that replaced the
        one meant is refused with 409 instead of deleted. `grace_period_seconds` 0: a pod removed from the
        API at once, without its kubelet's confirmation (one on a lost node, reconcilers/node_loss.py)."""
        res = resource_for(api_version, kind)
        self._count("delete")
        async with self._slots:
            if uid is None and grace_period_seconds is None:
                await self.client.delete(res, name, namespace=namespace, cascade=CascadeType.BACKGROUND)
                return
            # lightkube's delete sends no DeleteOptions body: the request is built the same way, with one.
            generic: Any = self.client._client
            request = generic.prepare_request("delete", res, name=name, namespace=namespace)
            options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions",
                                       "propagationPolicy": CascadeType.BACKGROUND.value}  # fmt: skip
            if uid is not None:
                options["preconditions"] = {"uid": uid}
            if grace_period_seconds is not None:
                options["gracePeriodSeconds"] = grace_period_seconds
            request.data = options
            response = await generic.send(generic.build_adapter_request(request))
            generic.handle_response("delete", response, request)


def access_review(group: str, resource: str, verb: str) -> SelfSubjectAccessReview:
    """May this operator `verb` `resource` cluster-wide? (Any authenticated user may ask.)"""
    attributes = ResourceAttributes(group=group, resource=resource, verb=verb)
    return SelfSubjectAccessReview(spec=SelfSubjectAccessReviewSpec(resourceAttributes=attributes))


async def allowed(api: Api, group: str, resource: str, verbs: tuple[str, ...]) -> bool:
    """Whether the API server's authorizer lets this operator use every one of `verbs` on `resource`."""
    for verb in verbs:
        review = await api.create(access_review(group, resource, verb))
        if not (review.status is not None and review.status.allowed):
            return False
    return True
