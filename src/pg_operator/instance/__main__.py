"""`python -m pg_operator.instance`: the PostgreSQL image's entrypoint (see main.py)."""

import sys

from pg_operator.instance.main import main

sys.exit(main())
