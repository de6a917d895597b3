"""kube-proxy's mode: nftables unless PGOP_PROXY_MODE asks for iptables; anything else is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from localkube.common import ClusterError, Context
from localkube.node import _kube_proxy_config, proxy_mode


def test_the_mode_defaults_to_nftables_and_follows_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGOP_PROXY_MODE", raising=False)
    assert proxy_mode() == "nftables"
    monkeypatch.setenv("PGOP_PROXY_MODE", "iptables")
    assert proxy_mode() == "iptables"


def test_an_unknown_mode_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGOP_PROXY_MODE", "ipvs")
    with pytest.raises(ClusterError, match="PGOP_PROXY_MODE='ipvs'"):
        proxy_mode()


def test_the_sync_settings_go_to_the_section_of_the_chosen_mode(tmp_path: Path) -> None:
    ctx = Context(state=tmp_path, cache=tmp_path / "cache")
    for mode in ("iptables", "nftables"):
        conf = _kube_proxy_config(ctx, mode)
        assert conf["mode"] == mode
        assert conf[mode]["minSyncPeriod"] == "1s"
        other = "nftables" if mode == "iptables" else "iptables"
        assert other not in conf
