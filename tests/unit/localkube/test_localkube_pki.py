"""The local cluster's certificates: one CA, the identities RBAC expects, the SANs pods and kubectl use.

(tests/conftest.py puts the repository root, where the localkube package is, on sys.path.)
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from localkube.common import KUBERNETES_SERVICE_IP, NODE_NAME, Context
from localkube.pki import CLIENTS, Pki, ensure_kubeconfigs


def openssl(*args: str) -> str:
    return subprocess.run(["openssl", *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    p = Pki(tmp_path_factory.mktemp("pki"))
    p.ensure("192.0.2.77")
    return p


def test_every_certificate_chains_to_the_ca(pki: Pki) -> None:
    for name in [*CLIENTS, "apiserver", "kubelet-serving"]:
        crt, key = pki.pair(name)
        assert "OK" in openssl("verify", "-CAfile", str(pki.ca_crt), str(crt))
        assert oct(key.stat().st_mode & 0o777) == "0o600", f"{key} is readable by others"


def test_identities_match_what_rbac_expects(pki: Pki) -> None:
    subject = openssl("x509", "-noout", "-subject", "-in", str(pki.kubelet_client[0]))
    assert f"CN = system:node:{NODE_NAME}" in subject and "O = system:nodes" in subject
    admin = openssl("x509", "-noout", "-subject", "-in", str(pki.admin[0]))
    assert "O = system:masters" in admin
    cm = openssl("x509", "-noout", "-subject", "-in", str(pki.pair("controller-manager")[0]))
    assert "system:masters" not in cm, "the controller-manager must not be cluster-admin by group"


def test_apiserver_certificate_names_what_clients_dial(pki: Pki) -> None:
    text = openssl("x509", "-noout", "-ext", "subjectAltName,extendedKeyUsage", "-in", str(pki.apiserver[0]))
    for san in (
        "DNS:kubernetes.default.svc",
        "IP Address:127.0.0.1",
        f"IP Address:{KUBERNETES_SERVICE_IP}",
        "IP Address:192.0.2.77",
    ):
        assert san in text
    assert "TLS Web Server Authentication" in text


def test_ensure_is_idempotent_and_keeps_the_ca(pki: Pki) -> None:
    before = pki.ca_crt.read_bytes(), pki.admin[0].read_bytes()
    pki.ensure("192.0.2.77")
    assert (pki.ca_crt.read_bytes(), pki.admin[0].read_bytes()) == before


def test_kubeconfigs_point_at_the_component_certificates(pki: Pki, tmp_path: Path) -> None:
    ctx = Context(state=tmp_path)
    ensure_kubeconfigs(ctx, pki)
    config = json.loads(ctx.kubeconfig("scheduler").read_text())
    user = config["users"][0]["user"]
    assert user["client-certificate"] == str(pki.pair("scheduler")[0])
    assert config["clusters"][0]["cluster"]["certificate-authority"] == str(pki.ca_crt)
    assert ctx.admin_kubeconfig.exists()
