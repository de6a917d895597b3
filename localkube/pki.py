"""Certificates and identities of the local cluster, as a real cluster has them.

One CA signs the API server's serving certificate and a client certificate per component; the
service-account token signing key is a separate key pair. Made once per state directory with the
openssl CLI (EC P-256 keys: fast to make, accepted everywhere).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from localkube.common import (
    APISERVER_PORT,
    CLUSTER_DOMAIN,
    KUBERNETES_SERVICE_IP,
    NODE_NAME,
    ClusterError,
    Context,
)

CertPair = tuple[Path, Path]

# name -> (CN, O or None); O=system:masters is cluster-admin through RBAC's bootstrap binding.
CLIENTS: dict[str, tuple[str, str | None]] = {
    "admin": ("localkube-admin", "system:masters"),
    "controller-manager": ("system:kube-controller-manager", None),
    "scheduler": ("system:kube-scheduler", None),
    "kubelet": (f"system:node:{NODE_NAME}", "system:nodes"),
    "kube-proxy": ("system:kube-proxy", None),
    "apiserver-kubelet-client": ("kube-apiserver-kubelet-client", "system:masters"),
    # KWOK acts for every fake node and its pods; a harness component, not part of the product.
    "kwok": ("localkube-kwok", "system:masters"),
}


def _openssl(*args: str) -> None:
    res = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise ClusterError(f"openssl {args[0]} failed: {res.stderr.strip()}")


@dataclass(frozen=True)
class Pki:
    dir: Path

    @property
    def ca_crt(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"

    def pair(self, name: str) -> CertPair:
        return self.dir / f"{name}.crt", self.dir / f"{name}.key"

    @property
    def apiserver(self) -> CertPair:
        return self.pair("apiserver")

    @property
    def admin(self) -> CertPair:
        return self.pair("admin")

    @property
    def kubelet_client(self) -> CertPair:
        return self.pair("kubelet")

    @property
    def kubelet_serving(self) -> CertPair:
        return self.pair("kubelet-serving")

    @property
    def kube_proxy(self) -> CertPair:
        return self.pair("kube-proxy")

    def _issue(self, name: str, subject: str, ext: str) -> None:
        crt, key = self.pair(name)
        if crt.exists() and key.exists():
            return
        with tempfile.TemporaryDirectory() as tmp:
            csr, extfile = Path(tmp) / "req.csr", Path(tmp) / "ext.cnf"
            extfile.write_text(ext)
            _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(key))
            _openssl("req", "-new", "-key", str(key), "-subj", subject, "-out", str(csr))
            _openssl(
                "x509",
                "-req",
                "-in",
                str(csr),
                "-CA",
                str(self.ca_crt),
                "-CAkey",
                str(self.ca_key),
                "-CAcreateserial",
                "-days",
                "3650",
                "-sha256",
                "-extfile",
                str(extfile),
                "-out",
                str(crt),
            )
        key.chmod(0o600)

    def ensure(self, host_ip: str) -> None:
        """Create whatever is missing; existing material is kept so kubeconfigs stay valid."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o700)
        if not self.ca_crt.exists():
            _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(self.ca_key))
            _openssl(
                "req",
                "-x509",
                "-new",
                "-key",
                str(self.ca_key),
                "-subj",
                "/CN=localkube-ca",
                "-days",
                "3650",
                "-sha256",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
                "-out",
                str(self.ca_crt),
            )
        if not self.sa_key.exists():
            _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(self.sa_key))
            _openssl("ec", "-in", str(self.sa_key), "-pubout", "-out", str(self.sa_pub))
        client_ext = "keyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n"
        server_ext = "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        for name, (cn, org) in CLIENTS.items():
            subject = f"/O={org}/CN={cn}" if org else f"/CN={cn}"
            self._issue(name, subject, client_ext)
        names = [
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            f"kubernetes.default.svc.{CLUSTER_DOMAIN}",
            "localhost",
        ]
        ips = ["127.0.0.1", KUBERNETES_SERVICE_IP, host_ip]
        sans = ",".join([f"DNS:{n}" for n in names] + [f"IP:{ip}" for ip in ips])
        self._issue("apiserver", "/CN=kube-apiserver", server_ext + f"subjectAltName={sans}\n")
        self._issue(
            "kubelet-serving",
            f"/CN={NODE_NAME}",
            server_ext + f"subjectAltName=DNS:{NODE_NAME},IP:127.0.0.1,IP:{host_ip}\n",
        )

    def node_client(self, node: str) -> CertPair:
        return self.pair(f"kubelet-{node}")

    def node_serving(self, node: str) -> CertPair:
        return self.pair(f"kubelet-serving-{node}")

    def ensure_node(self, node: str, ip: str) -> None:
        """One node of many: its kubelet's identity (system:node:<name>: the Node authorizer and
        NodeRestriction let it write only its own Node and the pods bound to it) and serving certificate."""
        client_ext = "keyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n"
        server_ext = "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        self._issue(f"kubelet-{node}", f"/O=system:nodes/CN=system:node:{node}", client_ext)
        self._issue(
            f"kubelet-serving-{node}",
            f"/CN={node}",
            server_ext + f"subjectAltName=DNS:{node},IP:127.0.0.1,IP:{ip}\n",
        )

    def write_kubeconfig(
        self, path: Path, user: str, crt: Path, key: Path, server: str = f"https://127.0.0.1:{APISERVER_PORT}"
    ) -> None:
        """A kubeconfig with embedded paths (JSON is valid YAML, so no YAML library is needed)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "localkube",
                    "cluster": {"server": server, "certificate-authority": str(self.ca_crt)},
                }
            ],
            "users": [{"name": user, "user": {"client-certificate": str(crt), "client-key": str(key)}}],
            "contexts": [{"name": "localkube", "context": {"cluster": "localkube", "user": user}}],
            "current-context": "localkube",
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(config, indent=2) + "\n")
        path.chmod(0o600)


def ensure_kubeconfigs(ctx: Context, pki: Pki) -> None:
    for name in CLIENTS:
        crt, key = pki.pair(name)
        target = ctx.admin_kubeconfig if name == "admin" else ctx.kubeconfig(name)
        pki.write_kubeconfig(target, name, crt, key)
