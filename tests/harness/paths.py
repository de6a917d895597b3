"""Where things are: the repository, the build cache, the local cluster's state directory."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOCALKUBE = REPO / "localkube"
CACHE = Path(
    os.environ.get("PGOP_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pg-operator"
)
STATE = Path(os.environ.get("PGOP_STATE", "/var/lib/pg-operator-localkube"))
