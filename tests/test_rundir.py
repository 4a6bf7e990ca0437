"""The private run directory: made per process tree, removed when its maker exits,
and swept by the next tree on the host when its maker was killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from monarch_nb._wire import _rundir

pytestmark = pytest.mark.timeout(60)

_HOLD = (
    "from monarch_nb._wire._rundir import run_dir\n"
    "import sys\n"
    "print(run_dir(), flush=True)\n"
    "sys.stdin.read()\n"  # until the test closes stdin (or kills us)
)


def _tree(base, *, hold: bool):
    """A fresh process tree's first process, making its run dir in ``base``."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("MONARCH_NB_RUN_DIR", "XDG_RUNTIME_DIR")
    }
    env["TMPDIR"] = str(base)
    code = _HOLD if hold else _HOLD.replace("sys.stdin.read()\n", "")
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_a_killed_makers_run_dir_is_removed_by_the_next_tree_and_a_live_ones_kept(tmp_path):
    killed, alive = _tree(tmp_path, hold=True), _tree(tmp_path, hold=True)
    try:
        killed_dir = killed.stdout.readline().strip()
        alive_dir = alive.stdout.readline().strip()
        # Not run dirs of ours, whatever their names say: left alone.
        killed_name = os.path.basename(killed_dir)
        namespace = os.stat("/proc/self/ns/pid").st_ino
        host = _rundir.host_tag()
        assert killed_name.startswith(f"monarch_nb-run-{namespace}-{killed.pid}-{host}-")
        other_host = "0" * 6 if host != "0" * 6 else "1" * 6
        others = [
            tmp_path / "monarch_nb-07-checkpoints",
            tmp_path / "monarch_nb-run-notapid",
            # The same dead pid in another pid namespace (a /tmp shared with a
            # container): not ours to judge.
            tmp_path / killed_name.replace(f"-{namespace}-", f"-{namespace + 1}-"),
            # The same dead pid and namespace made by another host (a TMPDIR that
            # cluster nodes share: their first pid namespaces have one inode).
            tmp_path / killed_name.replace(f"-{host}-", f"-{other_host}-"),
            # A run dir of an older version (no host in its name): not judged.
            tmp_path / killed_name.replace(f"-{host}-", "-"),
        ]
        for other in others:
            other.mkdir(mode=0o700)
        killed.send_signal(signal.SIGKILL)
        killed.wait(30)
        assert os.path.isdir(killed_dir)  # its exit handler never ran

        with _tree(tmp_path, hold=False) as next_tree:
            next_dir = next_tree.stdout.readline().strip()
            assert next_tree.wait(30) == 0

        assert not os.path.exists(killed_dir)
        assert os.path.isdir(alive_dir)  # its maker still runs
        assert not os.path.exists(next_dir)  # removed at its maker's exit, as always
        assert all(other.is_dir() for other in others)
        assert os.path.basename(next_dir).startswith(
            f"monarch_nb-run-{namespace}-{next_tree.pid}-{host}-"
        )
    finally:
        for proc in (killed, alive):
            with proc:  # closes its pipes; stdin's end lets it exit
                proc.stdin.close()
                proc.wait(30)
    assert not os.path.exists(alive_dir)
