"""A stand-in for a volume provisioner where there is none (kwok)."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from harness.objects import CLUSTER_LABEL


class PvProvisioner:
    """Stands in for a volume provisioner where there is none: a PersistentVolume, pre-bound, for each
    pending claim that carries the cluster label and whose class no provisioner serves. Uses the admin
    kubeconfig (lightkube, sync, one watch)."""

    def __init__(self, kubeconfig: str) -> None:
        from lightkube import Client, KubeConfig

        self.client = Client(KubeConfig.from_file(kubeconfig), field_manager="test-provisioner")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pv-provisioner", daemon=True)
        self.created = 0

    def __enter__(self) -> PvProvisioner:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def _served_by_a_provisioner(self, class_name: str | None) -> bool:
        """A class with a real provisioner (the full profile's hostpath one, or a kwok profile that has
        one) is left to it; only classes nobody provisions, or no class at all, are served here."""
        from lightkube.core.exceptions import ApiError
        from lightkube.resources.storage_v1 import StorageClass

        if not class_name:
            return False
        try:
            klass = self.client.get(StorageClass, class_name)
        except ApiError:
            return False
        return klass.provisioner != "kubernetes.io/no-provisioner"

    def _provision(self, pvc: Any) -> None:
        from lightkube.core.exceptions import ApiError
        from lightkube.models.core_v1 import (
            HostPathVolumeSource,
            ObjectReference,
            PersistentVolumeSpec,
        )
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import PersistentVolume

        if pvc.spec.volumeName or (pvc.status and pvc.status.phase == "Bound"):
            return
        if self._served_by_a_provisioner(pvc.spec.storageClassName):
            return
        meta = pvc.metadata
        size = (pvc.spec.resources.requests or {}).get("storage", "1Gi")
        pv = PersistentVolume(
            metadata=ObjectMeta(
                name=f"kwok-{meta.uid}", labels={CLUSTER_LABEL: meta.labels.get(CLUSTER_LABEL, "")}
            ),
            spec=PersistentVolumeSpec(
                capacity={"storage": size},
                accessModes=pvc.spec.accessModes or ["ReadWriteOnce"],
                storageClassName=pvc.spec.storageClassName or "",
                persistentVolumeReclaimPolicy="Delete",
                hostPath=HostPathVolumeSource(path=f"/tmp/kwok-pv/{meta.uid}"),
                claimRef=ObjectReference(namespace=meta.namespace, name=meta.name, uid=meta.uid),
            ),
        )
        try:
            self.client.create(pv)
            self.created += 1
        except ApiError as exc:
            if exc.status.code != 409:
                raise

    def _run(self) -> None:
        from lightkube import operators
        from lightkube.resources.core_v1 import PersistentVolumeClaim

        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                for kind, pvc in self.client.watch(
                    PersistentVolumeClaim, namespace="*", labels={CLUSTER_LABEL: operators.exists()}
                ):
                    if self._stop.is_set():
                        return
                    if kind in ("ADDED", "MODIFIED"):
                        with contextlib.suppress(Exception):
                            self._provision(pvc)
            time.sleep(0.5)
