"""A controller that exits with meshes still running reaps its zygote before it is
gone: nothing of it runs on, and no ``Popen`` of it is left to warn that its
process still runs (the ResourceWarning at the end of a test session)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from process_checks import wait_for_exit

# The first exit handler registered runs last, after monarch_nb's own: what it
# sees is what the interpreter leaves behind.
_CONTROLLER = textwrap.dedent(
    """
    import atexit, json, os

    def after_every_exit_handler():
        print(json.dumps({"zygote_left": os.path.exists(f"/proc/{zygote}")}), flush=True)

    atexit.register(after_every_exit_handler)

    import psutil
    from monarch_nb import this_host

    procs = this_host().spawn_procs(per_host={"procs": 2})
    zygote = psutil.Process(procs.pids[0]).ppid()
    print(json.dumps([zygote, *procs.pids]), flush=True)
    """
)


def test_a_controller_reaps_its_zygote_before_it_exits() -> None:
    done = subprocess.run(
        [sys.executable, "-W", "always::ResourceWarning", "-c", _CONTROLLER],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    started, seen = (json.loads(line) for line in done.stdout.splitlines())
    assert len(started) == 3  # the zygote and its two ranks
    # Still there (running, or a zombie never waited for) is what was left behind.
    assert seen == {"zygote_left": False}, done.stderr
    assert not wait_for_exit(set(started), 30), "the zygote's ranks outlived their controller"
    assert "ResourceWarning" not in done.stderr, done.stderr
