"""What a user can get wrong with the local cluster gets an error that says what to do."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from localkube.common import (
    DEFAULT_STATE,
    ClusterError,
    Context,
    require_commands,
    require_ports_free,
    wait_for,
)
from localkube.host import cgroup_parent


def test_a_busy_port_names_the_port_and_the_process_holding_it() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ClusterError) as err:
            require_ports_free({port: "kube-apiserver"})
    text = str(err.value)
    assert f"port {port} (kube-apiserver)" in text
    assert f"pid={os.getpid()}" in text, text  # ss names the holder
    assert "cluster-down" in text


def test_a_missing_command_names_the_package_and_the_install_command() -> None:
    with pytest.raises(ClusterError) as err:
        require_commands({"surely-not-installed-xyz": "xyz-tools"})
    assert "apt-get install -y xyz-tools" in str(err.value)


def test_a_component_that_dies_shows_the_end_of_its_log(tmp_path: Path) -> None:
    ctx = Context(state=tmp_path)
    ctx.spawn("doomed", ["/bin/sh", "-c", "echo cannot bind 6443: address in use; exit 3"])
    with pytest.raises(ClusterError) as err:
        wait_for("doomed to serve", lambda: False, timeout=10, ctx=ctx, component="doomed")
    text = str(err.value)
    assert "doomed exited" in text and "cannot bind 6443" in text
    assert str(ctx.log_path("doomed")) in text


def test_each_state_directory_gets_cgroups_of_its_own(tmp_path: Path) -> None:
    # Teardown empties the node's cgroup root: a second cluster (another PGOP_STATE) must not share it.
    default = cgroup_parent(Context(state=DEFAULT_STATE, cache=tmp_path))
    other = cgroup_parent(Context(state=tmp_path / "a", cache=tmp_path))
    assert default == "localkube"
    assert other.startswith("localkube-") and other != default
    assert other == cgroup_parent(Context(state=tmp_path / "a", cache=tmp_path))
    assert other != cgroup_parent(Context(state=tmp_path / "b", cache=tmp_path))
