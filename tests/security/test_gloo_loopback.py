"""Finding 9: a user's own ``init_process_group('gloo')`` on one host listens on
loopback only.

``env://`` starts torch's TCPStore on rank 0, which binds the wildcard address
whatever ``MASTER_ADDR`` says: its keys were readable and writable from another
host. On a one-host mesh ``MASTER_ADDR`` is now 127.0.0.1, the worker makes the
store listen there only, and ``GLOO_SOCKET_IFNAME`` puts gloo's own sockets on
the loopback interface. Proved with ``ss``: every TCP listener of the ranks.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import socket
import subprocess
import sys

import cloudpickle
import pytest

from monarch_nb import Actor, endpoint, this_host
from monarch_nb._wire._network import default_address, interface_of

# The ranks cannot import this directory: send its actors by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.skipif(not shutil.which("ss"), reason="needs ss (iproute2)")


class UserGroup(Actor):
    """What a user writes: the default group, every argument from the environment."""

    @endpoint
    def init(self) -> dict[str, str]:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        x = torch.ones(1)
        dist.all_reduce(x)
        assert int(x) == dist.get_world_size()
        names = ("MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME")
        return {name: os.environ.get(name, "") for name in names}

    @endpoint
    def destroy(self) -> None:
        import torch.distributed as dist

        dist.destroy_process_group()

    @endpoint
    def environment(self, name: str) -> str:
        return os.environ.get(name, "")


def _tcp_listeners(pids: set[int]) -> list[str]:
    """The local addresses of every TCP listener that a process in ``pids`` holds."""
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        owners = {int(pid) for pid in re.findall(r"pid=(\d+)", line)}
        if owners & pids:
            found.append(line.split()[3])  # State Recv-Q Send-Q Local Peer Process
    return found


def _host_of(local: str) -> str:
    host = local.rsplit(":", 1)[0].strip("[]")
    return host.split("%", 1)[0]  # 127.0.0.1%lo, as ss shows an interface bound


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "*" or "0.0.0.0": every interface


def test_a_users_gloo_group_on_one_host_listens_on_loopback_only():
    pytest.importorskip("torch")
    with this_host().spawn_procs(per_host={"procs": 2}, name="gloo-loopback") as procs:
        group = procs.spawn("group", UserGroup)
        envs = group.init.call().get(timeout=120).values()
        try:
            assert {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"}
            assert {e["GLOO_SOCKET_IFNAME"] for e in envs} == {interface_of("127.0.0.1")}
            listeners = _tcp_listeners(set(procs.pids))
            port = envs[0]["MASTER_PORT"]
            # The store (rank 0) and gloo's pairs are there, and all on loopback.
            assert any(local.endswith(f":{port}") for local in listeners), listeners
            assert [a for a in listeners if not _is_loopback(_host_of(a))] == []
            # From another interface of this host, as from another host: refused.
            address = default_address()
            if not address.startswith("127."):
                with pytest.raises(ConnectionRefusedError), socket.socket() as s:
                    s.connect((address, int(port)))
        finally:
            group.destroy.call().get(timeout=60)


def test_an_interface_the_user_chose_is_kept():
    with this_host().spawn_procs(
        per_host={"procs": 1}, env={"GLOO_SOCKET_IFNAME": "eth7"}, name="gloo-chosen"
    ) as procs:
        group = procs.spawn("group", UserGroup)
        assert group.environment.call_one("GLOO_SOCKET_IFNAME").get(timeout=60) == "eth7"
