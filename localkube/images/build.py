#!/usr/bin/env python3
"""The image builder's command line, `python3 localkube/images/build.py …` (localkube.images.cli; --help)."""

import sys
from pathlib import Path

if __name__ == "__main__":
    # Run as a script, sys.path[0] is this directory; the package lives at the repository root.
    sys.path[0] = str(Path(__file__).resolve().parents[2])
    from localkube.images.cli import main

    sys.exit(main())
