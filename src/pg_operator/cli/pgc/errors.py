"""Exit codes of `kubectl pgc` (docs/kubectl-pgc.md lists them) and the one error type commands raise."""

from __future__ import annotations

from typing import Final

OK: Final = 0
FAILED: Final = 1  # the API server refused or could not be reached, kubectl missing, anything unexpected
USAGE: Final = 2  # bad arguments (argparse's own code)
NOT_FOUND: Final = 3  # no such cluster, instance or namespace
NOT_READY: Final = 4  # `status`: the cluster is not Ready; other commands: nothing to act on (no primary…)
REFUSED: Final = 5  # the operator refused the request, or `--wait` ran out of time


class PgcError(Exception):
    """A failure to report in one line and exit with `code`."""

    def __init__(self, message: str, code: int = FAILED) -> None:
        super().__init__(message)
        self.code = code
