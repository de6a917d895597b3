"""Pack a root filesystem directory as an OCI image-layout tar that `ctr image import` accepts.

One gzip layer, an image config, a manifest and an index naming the image. Standard library only.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


@dataclass
class ImageConfig:
    """The runtime defaults an image carries (what a Dockerfile's USER/ENTRYPOINT/... would set)."""

    user: str = ""
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    labels: dict[str, str] = field(default_factory=dict)
    exposed_ports: list[str] = field(default_factory=list)


class _Hashing(io.RawIOBase):
    """A write-only stream that hashes and counts what passes through to `out`."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.sha = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        data = bytes(b)
        self.sha.update(data)
        self.size += len(data)
        self.out.write(data)
        return len(data)


def _tar_filter(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    # Numeric ownership only: the host's user names mean nothing inside the image.
    info.uname = info.gname = ""
    return info


def write_layer(rootfs: Path, out: IO[bytes]) -> tuple[str, str, int]:
    """Write rootfs as a gzip tar layer to out; return (diff_id, digest, compressed size)."""
    compressed = _Hashing(out)
    with gzip.GzipFile(fileobj=compressed, mode="wb", compresslevel=1, mtime=0) as gz:
        plain = _Hashing(gz)  # type: ignore[arg-type]
        with tarfile.open(fileobj=plain, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for entry in sorted(os.listdir(rootfs)):
                tar.add(rootfs / entry, arcname=entry, recursive=True, filter=_tar_filter)
    return f"sha256:{plain.sha.hexdigest()}", f"sha256:{compressed.sha.hexdigest()}", compressed.size


def _blob(data: bytes) -> tuple[str, bytes]:
    return f"sha256:{hashlib.sha256(data).hexdigest()}", data


def config_json(cfg: ImageConfig, diff_id: str, arch: str = "amd64") -> bytes:
    container: dict[str, Any] = {
        "Env": [f"{k}={v}" for k, v in cfg.env.items()],
        "WorkingDir": cfg.workdir,
    }
    if cfg.user:
        container["User"] = cfg.user
    if cfg.entrypoint:
        container["Entrypoint"] = cfg.entrypoint
    if cfg.cmd:
        container["Cmd"] = cfg.cmd
    if cfg.labels:
        container["Labels"] = cfg.labels
    if cfg.exposed_ports:
        container["ExposedPorts"] = {p: {} for p in cfg.exposed_ports}
    doc = {
        "architecture": arch,
        "os": "linux",
        "config": container,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "localkube/images/build.py"}],
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def pack(rootfs: Path, ref: str, cfg: ImageConfig, dest: Path, arch: str = "amd64") -> str:
    """Write an OCI image-layout tar of rootfs named ref (`name:tag`) to dest; return the manifest digest."""
    name, _, tag = ref.rpartition(":")
    if not name or "/" in tag:
        raise ValueError(f"image reference {ref!r} needs the form name:tag")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".layer-") as tmp:
        layer_path = Path(tmp) / "layer.tar.gz"
        with layer_path.open("wb") as f:
            diff_id, layer_digest, layer_size = write_layer(rootfs, f)
        cfg_digest, cfg_bytes = _blob(config_json(cfg, diff_id, arch))
        manifest = {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": {"mediaType": MEDIA_CONFIG, "digest": cfg_digest, "size": len(cfg_bytes)},
            "layers": [{"mediaType": MEDIA_LAYER, "digest": layer_digest, "size": layer_size}],
        }
        man_digest, man_bytes = _blob(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode())
        index = {
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": [
                {
                    "mediaType": MEDIA_MANIFEST,
                    "digest": man_digest,
                    "size": len(man_bytes),
                    "platform": {"architecture": arch, "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": ref,
                        "org.opencontainers.image.ref.name": tag,
                    },
                }
            ],
        }
        partial = dest.with_name(dest.name + ".partial")
        with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as out:

            def add_bytes(arcname: str, data: bytes) -> None:
                info = tarfile.TarInfo(arcname)
                info.size = len(data)
                info.mode = 0o644
                out.addfile(info, io.BytesIO(data))

            add_bytes("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
            add_bytes("index.json", json.dumps(index, sort_keys=True).encode())
            add_bytes(f"blobs/sha256/{man_digest[7:]}", man_bytes)
            add_bytes(f"blobs/sha256/{cfg_digest[7:]}", cfg_bytes)
            info = out.gettarinfo(str(layer_path), arcname=f"blobs/sha256/{layer_digest[7:]}")
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with layer_path.open("rb") as layer:
                out.addfile(info, layer)
        partial.replace(dest)
    return man_digest
