"""Types of `spec.tls`: certificates the user brings instead of the ones the operator makes.

Both are references to Secrets in the cluster's namespace that carry the cluster's label
(`db.example.com/cluster: <name>`, as a certificate manager's secret template can set), so the operator
sees them change. See docs/tls.md.
"""

from __future__ import annotations

from pydantic import Field

from pg_operator.api.backup import SECRET_NAME_PATTERN
from pg_operator.api.schema import SpecModel


class TlsSpec(SpecModel):
    ca_secret: str | None = Field(
        None,
        alias="caSecret",
        max_length=253,
        pattern=SECRET_NAME_PATTERN,
        description=(
            "A Secret holding the CA the operator issues the cluster's certificates with: ca.crt and ca.key, "
            "or tls.crt and tls.key (a certificate manager's CA). A new CA in it is rolled in through a "
            "bundle, as a rotation is."
        ),
    )
    server_secret: str | None = Field(
        None,
        alias="serverSecret",
        max_length=253,
        pattern=SECRET_NAME_PATTERN,
        description=(
            "A kubernetes.io/tls Secret (tls.crt, tls.key, ca.crt: what a certificate manager writes) the "
            "instances present instead of the operator's server certificate. It must name every Service "
            "and pod name the operator's would (docs/tls.md); it is used once it does, and renewed "
            "whenever the Secret changes."
        ),
    )
