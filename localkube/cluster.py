#!/usr/bin/env python3
"""The local cluster's command line, `python3 localkube/cluster.py up|down|status|kubeconfig|reset`
(localkube.cli; --help)."""

import sys
from pathlib import Path

if __name__ == "__main__":
    # Run as a script, sys.path[0] is this directory; the package lives at the repository root.
    sys.path[0] = str(Path(__file__).resolve().parents[1])
    from localkube.cli import main

    sys.exit(main())
