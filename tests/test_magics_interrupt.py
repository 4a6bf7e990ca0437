"""The kernel's interrupt and %%mesh --timeout reach the ranks (through the runtime's
interrupt handling, which the magics only wire to the kernel)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kernel_utils import Kernel

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    with Kernel(env={"MONARCH_NB_INTERRUPT_GRACE": "1"}) as k:
        k.ok("%load_ext monarch_nb")
        k.ok("%mesh start --procs 2 --name m")
        yield k


def _started(messages: list) -> bool:
    return (
        sum(m["content"]["text"].count("started") for m in messages if m["msg_type"] == "stream")
        >= 2
    )


def test_interrupt_stops_python_code_and_the_mesh_stays_usable(kernel):
    msg_id = kernel.execute(
        "%%mesh\nimport time\nprint('started', flush=True)\ntime.sleep(60)", wait=False
    )
    seen = kernel.iopub_for(msg_id, _started)  # both ranks are inside the sleep now
    kernel.manager.interrupt_kernel()
    reply = kernel.collect(msg_id)
    assert reply.status == "error"
    assert reply.error["ename"] == "KeyboardInterrupt"
    text = reply.traceback
    assert "interrupted on rank(s) 0-1; the mesh is usable" in text
    assert "time.sleep(60)" in text  # where the ranks were
    assert "_on_sigint" not in text  # the worker's own frames are not the user's
    assert "_main.py" not in text
    assert seen
    assert kernel.ok("%%mesh\nrank").text() == "[0] 0\n[1] 1\n"


def test_a_rank_stuck_outside_python_is_killed_and_reported():
    with Kernel(env={"MONARCH_NB_INTERRUPT_GRACE": "1"}) as kernel:
        kernel.ok("%load_ext monarch_nb")
        kernel.ok("%mesh start --procs 2 --name m")
        _stuck_rank_is_killed(kernel)


def _stuck_rank_is_killed(kernel: Kernel) -> None:
    pids = kernel.ok("%%mesh\nimport os\nos.getpid()").displays()
    msg_id = kernel.execute(
        "%%mesh\nimport signal, time\nprint('started', flush=True)\nif rank == 1:\n"
        "    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\ntime.sleep(60)",
        wait=False,
    )
    kernel.iopub_for(msg_id, _started)
    kernel.manager.interrupt_kernel()
    reply = kernel.collect(msg_id)
    assert reply.error["ename"] == "StuckRanksKilled"
    assert "interrupted; rank(s) 1 did not stop within 1.0 s" in reply.traceback
    # replaced at once: the mesh runs, rank 1 with a fresh process
    assert "monarch_nb replaced rank(s) 1 with fresh processes" in reply.traceback
    assert "running" in kernel.ok("%mesh status").text().splitlines()[0]
    assert kernel.ok("%%mesh\nrank").text() == "[0] 0\n[1] 1\n"
    assert pids != kernel.ok("%%mesh\nimport os\nos.getpid()").displays()


def test_timeout_interrupts_only_the_busy_rank(kernel):
    reply = kernel.execute("%%mesh --timeout 0.5\nimport time\nif rank == 1:\n    time.sleep(60)")
    assert reply.error["ename"] == "CallTimeout"
    assert "did not finish within 0.5 s; rank(s) 1 were interrupted" in reply.traceback
    assert kernel.ok("%%mesh\nrank").text() == "[0] 0\n[1] 1\n"


def test_fail_fast_interrupts_the_other_ranks(kernel, tmp_path):
    cell = (
        "%%mesh --fail-fast\nimport pathlib, time\nif rank == 0:\n"
        f"    while not pathlib.Path({str(tmp_path)!r}, 'in').exists():\n"
        "        time.sleep(0.01)\n    raise ValueError('rank 0 failed')\n"
        f"pathlib.Path({str(tmp_path)!r}, 'in').touch()\ntime.sleep(600)"
    )
    reply = kernel.execute(cell)
    assert reply.error["ename"] == "CellError"
    assert reply.stream("stderr") == (
        "[0] failed: ValueError: rank 0 failed (--fail-fast: interrupting rank(s) 1)\n"
    )
    text = reply.traceback
    assert "ValueError: rank 0 failed" in text
    assert "--- rank(s) 1 were interrupted (KeyboardInterrupt) and did not finish" in text
    assert "time.sleep(600)" not in text  # where the interrupted rank was is not a failure
    assert kernel.ok("%%mesh\nrank").text() == "[0] 0\n[1] 1\n"
