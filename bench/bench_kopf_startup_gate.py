"""kopf's startup gate (every object indexed before any handler runs), as released and with one shared wait.

Feeds a toggle set the way kopf's initial listing does (objects one by one, each dropping its toggle and
then waiting for the rest) and prints one JSON line: CPU seconds and gate checks per object count, for
kopf's own `ToggleSet.wait_for` and for `pg_operator.controller.kopf_toggles`'s shared wait.

    .venv/bin/python bench/bench_kopf_startup_gate.py --objects 1000 2000 3000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))

from test_kopf_toggles import ORIGINAL, SHARED, listing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--objects", type=int, nargs="+", default=[1000, 2000, 3000])
    args = parser.parse_args()
    result: dict[str, object] = {"bench": "kopf_startup_gate", "load_average_start": os.getloadavg()[0]}
    for n in args.objects:
        row = {}
        for name, wait_for in (("kopf", ORIGINAL), ("shared", SHARED)):
            started = time.process_time()
            checks = asyncio.run(listing(n, wait_for))
            row[name] = {"cpu_s": round(time.process_time() - started, 2), "gate_checks": checks}
        row["cpu_ratio"] = round(row["kopf"]["cpu_s"] / max(row["shared"]["cpu_s"], 0.01), 1)  # type: ignore[index]
        result[str(n)] = row
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
