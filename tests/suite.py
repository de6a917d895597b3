"""The whole test suite as `make test` runs it: two pytest sessions at once, each on a local cluster of
its own, and one verdict.

- **host**: the unit tier, then the e2e tier (full profile, one node, then its multi-node sub-tier),
  plus the tests that need the network (the image build). It runs where `make test` runs, as before.
- **integration**: the integration tier (kwok profile) in a private network and mount namespace
  (hack/private-netns.sh) with a state directory of its own, so its cluster collides with nothing of
  the host's: ports, bridge, iptables, cgroups.

Why: the integration tier is mostly waiting (on the API server, on the operator's reconciles, on a local
PostgreSQL), and so is much of the e2e tier (pods starting, Patroni's loops); run one after the other
they leave a 2-core machine idle for long stretches. Together they finish in about the time of the
longer one. The namespace has no network: what the integration tier downloads (PostgreSQL 16's
binaries, the Patroni venv) is fetched on the host first, into the same caches.

Each session writes its own log; the host's streams to the terminal, the integration session's is
printed when it ends. The last line is `suite: <passed> passed, <failed> failed in <s> s`, and the exit
status is non-zero if either session failed. Extra arguments go to both pytest sessions.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

INTEGRATION = "tests/integration"
# Integration modules that need the network (a Debian mirror, the package index): they run on the host.
NEEDS_NETWORK = ("tests/integration/test_image_build.py",)
# The private namespace's address (192.0.2.<octet>, hack/private-netns.sh) and its cluster's state.
OCTET = os.environ.get("PGOP_SUITE_OCTET", "250")
STATE = Path(os.environ.get("PGOP_SUITE_STATE", "/var/lib/pg-operator-localkube-integration"))


def prefetch() -> None:
    """What the integration tier would download, fetched here where the network is."""
    from harness import patroni_instance

    patroni_instance.postgresql_16()
    patroni_instance.patroni_python()


def integration_command(python: str, extra: list[str]) -> list[str]:
    deselect = [f"--ignore={m}" for m in NEEDS_NETWORK]
    pytest = " ".join([python, "-m", "pytest", INTEGRATION, *deselect, *map(_quote, extra)])
    # The cluster is stopped inside the namespace whatever pytest did: its mounts live only there.
    script = f"{pytest}; rc=$?; {python} localkube/cluster.py down >/dev/null 2>&1; exit $rc"
    return ["unshare", "--net", "--mount", "hack/private-netns.sh", OCTET, str(STATE), "bash", "-c", script]


def host_command(python: str, extra: list[str]) -> list[str]:
    return [python, "-m", "pytest", "tests/unit", *NEEDS_NETWORK, "tests/e2e", *extra]


def _quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"


def tally(log: str) -> tuple[int, int]:
    """(passed, failed) from a pytest session's last summary line; errors count as failed."""
    passed = failed = 0
    for line in log.splitlines():
        if line.startswith("=") and (" passed" in line or " failed" in line or " error" in line):
            passed = failed = 0
            for part in line.strip("= ").split(" in ")[0].split(", "):
                count, _, what = part.partition(" ")
                if count.isdigit():
                    if what.startswith("passed"):
                        passed = int(count)
                    elif what.startswith(("failed", "error")):
                        failed += int(count)
    return passed, failed


def main(extra: list[str]) -> int:
    python = sys.executable
    started = time.monotonic()
    prefetch()
    logs = Path(tempfile.mkdtemp(prefix="pgop-suite-"))
    integration_log = logs / "integration.log"
    with integration_log.open("w") as out:
        integration = subprocess.Popen(integration_command(python, extra), cwd=REPO, stdout=out,
                                       stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    print(f"suite: integration tier running in a private namespace, log {integration_log}", flush=True)

    def stop(signum: int, _frame: object) -> None:
        # Let the namespace's session tear its cluster down (its bash runs `down` after pytest ends).
        os.killpg(integration.pid, signal.SIGINT)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    host_log = logs / "host.log"
    with host_log.open("w") as copy:
        host = subprocess.Popen(host_command(python, extra), cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)  # fmt: skip
        assert host.stdout is not None
        for line in host.stdout:
            sys.stdout.write(line)
            copy.write(line)
        host_rc = host.wait()
    integration_rc = integration.wait()
    text = integration_log.read_text(errors="replace")
    print(f"\nsuite: the integration tier's session (exit {integration_rc}):\n{text}", flush=True)
    passed_h, failed_h = tally(host_log.read_text(errors="replace"))
    passed_i, failed_i = tally(text)
    failed = (
        failed_h
        + failed_i
        + int(host_rc not in (0, 5) and not failed_h)
        + int(integration_rc not in (0, 5) and not failed_i)
    )
    elapsed = time.monotonic() - started
    print(f"suite: host {passed_h} passed, {failed_h} failed (exit {host_rc}); "
          f"integration {passed_i} passed, {failed_i} failed (exit {integration_rc})")  # fmt: skip
    print(f"suite: {passed_h + passed_i} passed, {failed} failed in {elapsed:.1f} s", flush=True)
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
