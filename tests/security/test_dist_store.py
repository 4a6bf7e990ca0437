"""``--dist gloo`` on one host opens no port to the network: torch.distributed's
ranks meet in a FileStore in the private run directory, not in a TCPStore that
would listen on every interface (finding 9 of the red-team issue)."""

from __future__ import annotations

import ipaddress
import os
import stat

import psutil
import pytest


def _listening_beyond_loopback(pid: int) -> list:
    sockets = psutil.Process(pid).net_connections(kind="inet")
    return [
        s.laddr
        for s in sockets
        if s.status == psutil.CONN_LISTEN and not ipaddress.ip_address(s.laddr.ip).is_loopback
    ]


def test_a_gloo_mesh_on_one_host_listens_on_no_network_port():
    pytest.importorskip("torch")
    from monarch_nb.magics import start_mesh

    mesh = start_mesh(procs=2, dist="gloo", name="private-store")
    try:
        assert mesh.run("x = torch.ones(1)\ndist.all_reduce(x)\nint(x)").values() == [2, 2]
        for pid in mesh.procs.pids:
            assert _listening_beyond_loopback(pid) == []
        (store,) = set(mesh.run("os.environ['MONARCH_NB_DIST_FILE']").values())
        run_dir = os.path.dirname(store)
        assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700  # our uid only
        # After a partial restart the ranks meet again, in a fresh file.
        mesh.restart("1")
        assert mesh.run("x = torch.ones(1)\ndist.all_reduce(x)\nint(x)").values() == [2, 2]
        for pid in mesh.procs.pids:
            assert _listening_beyond_loopback(pid) == []
    finally:
        mesh.stop()
