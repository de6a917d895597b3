"""The instance pod's entrypoint (`python -m pg_operator.instance`): renders Patroni's configuration
from the mounted instance ConfigMap, Secrets and environment, bootstraps the application role and
database, and execs Patroni.

Runs inside the PostgreSQL image, whose build context holds only the modules this package imports
(images/postgres/Dockerfile.dockerignore; tests/unit/instance/test_image_context.py keeps the list
true). May import `api`, `backup`, `orchestration.patroni_settings`; never `controller` or `specs`.
"""
