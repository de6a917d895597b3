"""An S3-compatible server for the backup tests and benchmarks: moto in server mode with IAM
authentication on, a child of this process, listening on loopback (or every address where pods must
reach it)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.net import free_port
from harness.processes import stop_process
from harness.waiting import wait_until
from pg_operator.backup.barman import CHECKSUM_ENV, credentials_env

REGION = "us-east-1"


@dataclass
class S3Server:
    endpoint: str
    access_key_id: str
    secret_access_key: str = field(repr=False)
    proc: subprocess.Popen[bytes] = field(repr=False)
    log: Path

    def client(self, *, secret: str | None = None) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=secret or self.secret_access_key,
            region_name=REGION,
        )

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        out: list[str] = []
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            out += [o["Key"] for o in page.get("Contents", [])]
        return sorted(out)

    def env(self, **override: str) -> dict[str, str]:
        """What a barman-cloud call needs besides its argv: checksum settings, region, credentials."""
        creds = credentials_env(
            override.get("access_key_id", self.access_key_id),
            override.get("secret_access_key", self.secret_access_key),
        )
        return {**CHECKSUM_ENV, "AWS_DEFAULT_REGION": REGION, **creds}

    @property
    def port(self) -> int:
        return int(self.endpoint.rsplit(":", 1)[1])

    def stop(self) -> None:
        stop_process(self.proc)


@contextlib.contextmanager
def s3_server(workdir: Path, *, bind: str = "127.0.0.1", user: str = "backup") -> Iterator[S3Server]:
    """moto's server with authentication: the first 3 requests (unauthenticated) create the user, its key
    and its policy; every later request must be signed with that key.

    It listens on `bind`: loopback for processes on this host, "0.0.0.0" where pods must reach it too
    (the e2e tests, inside a private network namespace); `endpoint` is always the loopback address."""
    port = free_port()
    log = workdir / "moto.log"
    moto = Path(sys.executable).with_name("moto_server")
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"}
    with log.open("wb") as out:
        proc = subprocess.Popen([str(moto), "-H", bind, "-p", str(port)], stdout=out, stderr=out, env=env)
    endpoint = f"http://127.0.0.1:{port}"
    try:

        def listening() -> bool:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True

        wait_until("moto", listening, 30)
        import boto3

        iam = boto3.client("iam", endpoint_url=endpoint, aws_access_key_id="bootstrap",
                           aws_secret_access_key="bootstrap", region_name=REGION)  # fmt: skip
        iam.create_user(UserName=user)
        key = iam.create_access_key(UserName=user)["AccessKey"]
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName=user, PolicyName="all", PolicyDocument=json.dumps(policy))
        yield S3Server(endpoint, key["AccessKeyId"], key["SecretAccessKey"], proc, log)
    finally:
        stop_process(proc)
