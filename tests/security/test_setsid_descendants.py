"""Finding 13: nothing a rank starts outlives it, not even in a session of its own.

A process a rank starts that calls ``setsid`` and loses its parent (a double
fork, as daemons do) left the rank's process group, so killing that group on
stop missed it, and init adopted it. A rank is now a child subreaper: such an
orphan is reparented to the rank, and the rank (on stop) or whoever kills it
(the controller here, an agent on other hosts) kills its whole tree first.
"""

from __future__ import annotations

import os
import subprocess
import sys

import cloudpickle
import psutil
import pytest
from process_checks import wait_for_exit

from monarch_nb import Actor, endpoint, this_host

# The ranks cannot import this directory: send its actors by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux subreaper")

GONE_WITHIN_S = 10.0


class Daemonizer(Actor):
    @endpoint
    def start_daemon(self) -> tuple[int, int]:
        """``setsid sleep 600`` started by a child that exits at once (a double
        fork): the sleep's parent is gone. Returns the sleep's pid and this rank's."""
        child = subprocess.run([sys.executable, "-c", _DOUBLE_FORK], capture_output=True, text=True)
        assert child.returncode == 0, child.stderr
        return int(child.stdout), os.getpid()


# Popen returns once the sleep has called setsid() and exec'd: its pid is then
# the leader of a session of its own.
_DOUBLE_FORK = """
import subprocess
sleep = subprocess.Popen(
    ["sleep", "600"], start_new_session=True,
    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
)
print(sleep.pid)
sleep.returncode = 0  # left running on purpose: no ResourceWarning
"""


def _assert_orphan_adopted(daemon: int, rank: int) -> None:
    # It left the rank's session and process group, and the rank adopted it.
    assert os.getsid(daemon) == daemon != os.getsid(rank)
    assert os.getpgid(daemon) != os.getpgid(rank)
    assert psutil.Process(daemon).ppid() == rank


def _kill_if_alive(pid: int) -> None:
    try:
        psutil.Process(pid).kill()
    except psutil.NoSuchProcess:
        pass


def test_a_setsid_grandchild_is_gone_after_stop():
    procs = this_host().spawn_procs(per_host={"procs": 1}, name="setsid-stop")
    daemon = 0
    try:
        daemon, rank = procs.spawn("d", Daemonizer).start_daemon.call_one().get(timeout=60)
        _assert_orphan_adopted(daemon, rank)
        procs.stop()
        assert wait_for_exit({daemon}, GONE_WITHIN_S) == set()
    finally:
        procs.stop()
        if daemon:
            _kill_if_alive(daemon)


def test_a_setsid_grandchild_is_gone_when_its_rank_is_killed():
    procs = this_host().spawn_procs(per_host={"procs": 1}, name="setsid-kill")
    daemon = 0
    try:
        daemon, rank = procs.spawn("d", Daemonizer).start_daemon.call_one().get(timeout=60)
        _assert_orphan_adopted(daemon, rank)
        procs.kill([0])  # no graceful exit: the controller kills the rank's tree
        assert wait_for_exit({daemon, rank}, GONE_WITHIN_S) == set()
    finally:
        procs.stop()
        if daemon:
            _kill_if_alive(daemon)
