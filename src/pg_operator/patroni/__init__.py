"""Patroni's REST API in the instance pods (port 8008): cluster view, switchover, restart, dynamic
configuration. May import `api`; never `controller`.
"""
