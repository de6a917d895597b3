"""Pure parts of the local image builder and the volume provisioner: OCI layout, image.json, PVs."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
from localkube.common import ClusterError
from localkube.hostpath import provisioner
from localkube.images import oci
from localkube.images.spec import ImageSpec


def test_pack_writes_an_oci_layout_whose_digests_and_names_match(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "hello").write_text("#!/bin/sh\necho hi\n")
    (root / "bin" / "hello").chmod(0o755)
    (root / "link").symlink_to("bin/hello")
    cfg = oci.ImageConfig(user="999:999", entrypoint=["/bin/hello"], env={"A": "1"}, workdir="/w")
    dest = tmp_path / "out.tar"
    digest = oci.pack(root, "localhost/x/hello:1.2", cfg, dest)

    with tarfile.open(dest) as t:

        def blob(d: str) -> bytes:
            f = t.extractfile(f"blobs/sha256/{d.split(':')[1]}")
            assert f is not None
            data = f.read()
            assert "sha256:" + hashlib.sha256(data).hexdigest() == d
            return data

        index = json.load(t.extractfile("index.json"))  # type: ignore[arg-type]
        (entry,) = index["manifests"]
        assert entry["digest"] == digest
        assert entry["annotations"] == {
            "io.containerd.image.name": "localhost/x/hello:1.2",
            "org.opencontainers.image.ref.name": "1.2",
        }
        manifest = json.loads(blob(digest))
        config = json.loads(blob(manifest["config"]["digest"]))
        layer = blob(manifest["layers"][0]["digest"])
    plain = gzip.decompress(layer)
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(plain).hexdigest()]
    assert config["config"]["User"] == "999:999"
    assert config["config"]["Entrypoint"] == ["/bin/hello"]
    assert config["config"]["Env"] == ["A=1"]
    assert config["config"]["WorkingDir"] == "/w"
    with tarfile.open(fileobj=io.BytesIO(plain)) as layer_tar:
        members = {m.name: m for m in layer_tar.getmembers()}
    assert members["bin/hello"].mode & 0o777 == 0o755
    assert members["link"].issym() and members["link"].linkname == "bin/hello"


def test_pack_refuses_a_reference_without_tag(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    with pytest.raises(ValueError, match="name:tag"):
        oci.pack(tmp_path / "r", "localhost/x/hello", oci.ImageConfig(), tmp_path / "o.tar")


def spec_dir(tmp_path: Path, doc: dict[str, object]) -> Path:
    d = tmp_path / "img"
    d.mkdir()
    (d / "recipe.sh").write_text("true\n")
    (d / "image.json").write_text(json.dumps(doc))
    return d


def test_image_json_tag_template_maps_a_tag_back_to_its_args(tmp_path: Path) -> None:
    d = spec_dir(
        tmp_path,
        {
            "name": "localhost/pg",
            "tag": "${PG_VERSION}",
            "recipe": "recipe.sh",
            "args": {"PG_VERSION": ["15.19", "16.13"]},
            "env": {"V": "${PG_VERSION}"},
        },
    )
    spec = ImageSpec.load(d)
    assert spec.args == {"PG_VERSION": "15.19"}
    assert spec.args_for_tag("16.13") == {"PG_VERSION": "16.13"}
    assert spec.ref({"PG_VERSION": "16.13"}) == "localhost/pg:16.13"
    assert spec.image_config({"PG_VERSION": "16.13"}).env == {"V": "16.13"}
    with pytest.raises(ClusterError, match=r"args\.PG_VERSION='17\.0' is not one of 15\.19, 16\.13"):
        spec.args_for_tag("17.0")


def test_image_json_errors_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match=r"unknown field.*colour"):
        ImageSpec.load(spec_dir(tmp_path, {"name": "a", "tag": "1", "colour": "red"}))


def test_image_json_requires_name(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="'name' is required"):
        ImageSpec.load(spec_dir(tmp_path, {"tag": "1"}))


def test_provisioned_volume_is_local_with_affinity_to_the_selected_node(tmp_path: Path) -> None:
    pvc = {
        "metadata": {"name": "data-db-0", "namespace": "shop", "uid": "u-1"},
        "spec": {"resources": {"requests": {"storage": "20Gi"}}, "accessModes": ["ReadWriteOnce"]},
    }
    pv = provisioner.persistent_volume(pvc, "node-a", tmp_path / "pvc-u-1", "standard", "p.example/x")
    assert pv["metadata"]["name"] == "pvc-u-1"
    assert pv["spec"]["local"] == {"path": str(tmp_path / "pvc-u-1")}
    assert pv["spec"]["claimRef"]["uid"] == "u-1"
    term = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]
    assert term == {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-a"]}
    assert pv["spec"]["capacity"] == {"storage": "20Gi"}


@pytest.mark.parametrize(("q", "expected"), [("1Gi", 2**30), ("500M", 5e8), ("1.5Ki", 1536), ("10", 10)])
def test_quantities_compare_in_bytes(q: str, expected: float) -> None:
    assert provisioner.quantity_bytes(q) == expected
