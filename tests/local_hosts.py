"""Host meshes whose "hosts" are all this machine: "ssh" runs each host's agent
locally, so the agents, their links and the tree between them are real."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from process_checks import wait_for_exit

from monarch_nb import config, ssh_hosts

LOCAL_SSH = (sys.executable, "-c", "import os,sys; os.execvp('sh', ['sh', '-c', sys.argv[2]])")


def tree_hosts(n: int, fanout: str = "2") -> Any:
    """Hosts h0 .. h{n-1}, casts to them relayed down a tree of fan-out ``fanout``."""
    with config.configured(host_tree_fanout=fanout):
        return ssh_hosts([f"h{i}" for i in range(n)], ssh=LOCAL_SSH, bind="127.0.0.1")


@contextmanager
def tree_procs(n: int, per_host: int = 1, fanout: str = "2") -> Iterator[tuple[Any, Any]]:
    """``(hosts, procs)``: :func:`tree_hosts` with ``per_host`` processes on each;
    at the end the hosts are shut down and none of their processes (the ranks',
    the agents') may be left."""
    hosts = tree_hosts(n, fanout)
    try:
        procs = hosts.spawn_procs({"procs": per_host})
        pids = set(procs.pids) | {a.pid for a in hosts._agents.agents}
        yield hosts, procs
        procs.stop()
    finally:
        hosts.shutdown()
    left = wait_for_exit(pids, 30)
    assert not left, f"processes {sorted(left)} outlived their host mesh"
