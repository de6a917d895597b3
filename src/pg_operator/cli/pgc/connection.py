"""Where `kubectl pgc` talks to: the kubeconfig, context and namespace resolved as kubectl resolves them
(`--kubeconfig`, else the first file of $KUBECONFIG that exists, else ~/.kube/config; `--context`, else
the current context; `-n`, else the context's namespace, else `default`), a lightkube client on it, and
`kubectl` command lines carrying the same choices for what needs exec or a terminal."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig, SingleConfig
from lightkube.core.exceptions import ApiError, ConfigError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.core_v1 import Pod

from pg_operator import objects
from pg_operator.api.constants import CLUSTER_LABEL, GROUP, KIND, PLURAL, SHORT, VERSION
from pg_operator.cli.pgc.errors import FAILED, NOT_FOUND, PgcError

PostgresCluster = create_namespaced_resource(GROUP, VERSION, KIND, PLURAL)
Backup = create_namespaced_resource(GROUP, VERSION, "Backup", "backups")
FIELD_MANAGER = "kubectl-pgc"


def kubeconfig_file(explicit: str | None, env: Mapping[str, str]) -> Path | None:
    """The kubeconfig kubectl would read; None when there is none (in a pod: the service account)."""
    if explicit:
        return Path(explicit).expanduser()
    for part in (env.get("KUBECONFIG") or "").split(os.pathsep):
        if part and Path(part).expanduser().is_file():
            return Path(part).expanduser()
    default = Path("~/.kube/config").expanduser()
    return default if default.is_file() else None


@dataclass
class Connection:
    client: Client
    namespace: str
    kubeconfig: str | None
    context: str | None
    config: SingleConfig | None = None

    def streaming_client(self) -> Client:
        """A client whose reads may wait for ever (a followed log is quiet for minutes)."""
        return Client(
            config=self.config,
            namespace=self.namespace,
            field_manager=FIELD_MANAGER,
            timeout=httpx2.Timeout(30, read=None),
        )

    def kubectl(self, *args: str) -> list[str]:
        """A kubectl command line in the same kubeconfig, context and namespace."""
        exe = shutil.which("kubectl")
        if exe is None:
            raise PgcError("kubectl is not on PATH (needed for exec into pods)")
        argv = [exe]
        if self.kubeconfig:
            argv += ["--kubeconfig", self.kubeconfig]
        if self.context:
            argv += ["--context", self.context]
        return [*argv, "-n", self.namespace, *args]


def connect(kubeconfig: str | None, context: str | None, namespace: str | None) -> Connection:
    path = kubeconfig_file(kubeconfig, os.environ)
    try:
        if path is not None:
            if not path.is_file():
                raise PgcError(f"--kubeconfig {path}: no such file")
            config = KubeConfig.from_file(path)
        else:
            config = KubeConfig.from_env()  # in a pod: its service account
        single = config.get(context_name=context)
    except ConfigError as exc:
        raise PgcError(f"kubeconfig: {exc}") from None
    except KeyError:
        raise PgcError(f"--context {context}: no such context in the kubeconfig") from None
    if single is None:
        raise PgcError("kubeconfig names no current context: pass --context")
    ns = namespace or single.namespace or "default"
    client = Client(config=single, namespace=ns, field_manager=FIELD_MANAGER, timeout=httpx2.Timeout(30))
    return Connection(client, ns, str(path) if path else None, context, single)


def as_dict(obj: Any) -> dict[str, Any]:
    """A lightkube object (typed model or generic resource) as the API's JSON."""
    return dict(obj.to_dict())


def api_error(exc: ApiError) -> PgcError:
    code = NOT_FOUND if exc.status.code == 404 else FAILED
    return PgcError(f"the API server answered {exc.status.code}: {exc.status.message}", code)


def get_cluster(conn: Connection, name: str) -> dict[str, Any]:
    try:
        return as_dict(conn.client.get(PostgresCluster, name, namespace=conn.namespace))
    except ApiError as exc:
        if exc.status.code != 404:
            raise api_error(exc) from None
        listed = conn.client.list(PostgresCluster, namespace=conn.namespace)
        others = [objects.name(as_dict(c)) for c in listed]
        there = f"; clusters there: {', '.join(sorted(others))}" if others else "; there is none there"
        raise PgcError(f'no {SHORT} "{name}" in namespace "{conn.namespace}"{there}', NOT_FOUND) from None


def cluster_pods(conn: Connection, name: str) -> list[dict[str, Any]]:
    pods = conn.client.list(Pod, namespace=conn.namespace, labels={CLUSTER_LABEL: name})
    dicts = [as_dict(p) for p in pods]
    # The backup Jobs' pods (if any) carry the label too; instances are the StatefulSet's.
    return sorted((p for p in dicts if is_instance_pod(objects.name(p), name)), key=objects.name)


def is_instance_pod(pod: str, cluster: str) -> bool:
    """`<cluster>-<ordinal>`: the StatefulSet's pods (other pods may carry the cluster label)."""
    head, _, ordinal = pod.rpartition("-")
    return head == cluster and ordinal.isdigit()
