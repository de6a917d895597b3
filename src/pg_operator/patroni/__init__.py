"""Talking to Patroni's REST API in the instance pods (port 8008)."""
