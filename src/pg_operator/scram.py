"""SCRAM-SHA-256 password verifiers (RFC 5802/7677, PostgreSQL's `SCRAM-SHA-256$…` form).

The entrypoint (at bootstrap) and the operator (when a Secret changes) send roles a verifier, never the
password, so a statement log or pg_stat_statements can never show a password. A leaf: imports nothing
of pg_operator.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import unicodedata

ITERATIONS = 4096  # PostgreSQL's default scram_iterations


def _normalised(password: str) -> bytes:
    # PostgreSQL applies SASLprep when the password is valid UTF-8 and prep succeeds; for the printable
    # passwords the operator generates, NFKC normalisation is what SASLprep changes.
    return unicodedata.normalize("NFKC", password).encode("utf-8")


def scram_sha256_verifier(password: str, *, salt: bytes | None = None, iterations: int = ITERATIONS) -> str:
    if not password:
        raise ValueError("password must not be empty")
    salt = salt if salt is not None else secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", _normalised(password), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode("ascii")

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"
