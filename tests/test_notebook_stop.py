"""The notebook's stop, hang verdict, grouped failures and quiet replay, through a real
kernel (issue 62, items 1, 3, 6, 7). Each test replaces processes, so each has a
kernel of its own (the leak check is per test), with a gloo mesh of 3 ranks.

Rank 1 skips an all_reduce the others enter: the stop button (the kernel's
interrupt) and ``%mesh why`` say the same (rank 1 never joined, and is idle);
the ranks stuck in the collective are killed after the grace and replaced, in
a blocking cell and in a ``--no-block`` one (where the kernel is idle).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from kernel_utils import Kernel, plain

pytestmark = pytest.mark.timeout(240)

SKIP = (
    "%%mesh{options}\nprint('started', flush=True)\nx = torch.ones(2)\n"
    "if rank != 1:\n    dist.all_reduce(x)\n"
)
VERDICT = "→ rank 1 never entered all_reduce #"
IDLE = "(idle: the call or cell ended there without calling it): the others wait for it"


@contextmanager
def _kernel() -> Iterator[Kernel]:
    # A grace of 1 s; the dashboard suspects a hang after 1 s of ranks busy alone.
    with Kernel(env={"MONARCH_NB_INTERRUPT_GRACE": "1", "MONARCH_NB_HANG_AFTER": "1"}) as k:
        k.ok("%load_ext monarch_nb")
        k.ok("%mesh start --procs 3 --name m --dist gloo --no-dashboard", timeout=120)
        yield k


def _started(messages: list) -> bool:
    return _text(messages).count("started") >= 3


def test_stop_kills_and_replaces_stuck_ranks_and_agrees_with_mesh_why():
    with _kernel() as kernel:
        _no_block_cell_is_stopped_and_its_ranks_replaced(kernel)
        _blocking_cell_stop_says_what_mesh_why_says(kernel)
        _the_panels_interrupt_kills_and_replaces_too(kernel)


def test_grouped_failures_and_a_quiet_replay():
    with _kernel() as kernel:
        _failure_on_every_rank_prints_one_traceback(kernel)
        _replay_shows_one_header_per_cell_and_hides_the_output(kernel)


def _in_collective(kernel: Kernel) -> str:
    """``%mesh why`` once ranks 0 and 2 wait in the all_reduce (a loaded machine
    may show them on their way in first)."""
    for _ in range(30):
        text = kernel.ok("%mesh why").text()
        if "ranks 0,2 waiting in all_reduce" in text:
            return text
    raise AssertionError(f"ranks 0,2 never seen in the all_reduce:\n{text}")


def _usable(kernel: Kernel) -> None:
    """Every rank answers and the process group works again."""
    reply = kernel.ok("%%mesh\ny = torch.ones(1)\ndist.all_reduce(y)\ny", timeout=120)
    assert reply.text() == "[0-2] tensor([3.])\n"


def _no_block_cell_is_stopped_and_its_ranks_replaced(kernel: Kernel) -> None:
    pids = kernel.ok("%%mesh\nimport os\nos.getpid()").text()
    kernel.ok("from monarch_nb.magics import current_mesh\nboard = current_mesh().dashboard()")
    msg_id = kernel.execute(SKIP.format(options=" --no-block"), wait=False)
    first = kernel.collect(msg_id).stream().count("started")  # idle; the cell runs on
    kernel.iopub_for(msg_id, lambda ms: first + _text(ms).count("started") >= 3)
    why = _in_collective(kernel)
    assert VERDICT in why
    assert IDLE in why
    assert "rank 1 not in it: idle" in why
    # The dashboard marks rank 1's tile, live, before anyone presses stop.
    marked = kernel.ok(
        "print(board.wait_until(lambda d: 'never joined all_reduce' in d.grid.tile(1), 60))\n"
        "print(board.hang.verdict)\nprint('never joined' in board.grid.tile(0))"
    ).text()
    assert marked.splitlines()[0] == "True", marked
    assert VERDICT in marked
    assert marked.splitlines()[-1] == "False"
    assert "ranks 0,2 wait" in kernel.ok("print(board.grid.tile(1))").text()
    # Its actions bar picked rank 1 and shows the diagnosis unasked; the kernel is
    # idle (--no-block), so its "why" button answers too: one verdict, %mesh why's.
    bar = kernel.ok(
        "print(board.actions.picker.value)\n"
        "print(board.actions.output.value)\n"
        "print(board.actions.run('why'))"
    ).text()
    assert bar.splitlines()[0] == "1", bar
    assert 'data-action="offer" data-rank="1"' in bar
    assert 'data-action="why" data-rank="1"' in bar
    assert _verdicts(bar) == [_verdicts(why)[0]] * 2, bar

    kernel.manager.interrupt_kernel()  # the stop button, while the kernel is idle
    late = kernel.iopub_for(
        msg_id, lambda ms: "StuckRanksKilled" in _text(ms) and "keep their state" in _text(ms)
    )
    text = plain(_text(late))
    # Which ranks, why, what happened to them, and the same verdict as %mesh why: once.
    assert text.count("StuckRanksKilled") == 1
    assert "MeshFailure" not in text
    assert "rank(s) 0,2 did not stop within 1.0 s of the interrupt" in text
    assert "monarch_nb replaced rank(s) 0,2 with fresh processes" in text
    assert "rank(s) 1 keep their state" in text
    assert VERDICT in text
    assert IDLE in text
    assert "every rank is in the collective" not in text

    # Killed on purpose: reported as that, not as crashes, once per rank. Each
    # rank's record comes when its death is seen, which may be after the message.
    killed = "was killed by monarch_nb: it did not stop within 1.0 s"
    deadline = time.monotonic() + 60
    while True:
        causes = kernel.ok(
            "from monarch_nb.magics import current_mesh\n"
            "print(sorted((r.rank, r.cause) for r in current_mesh().failures.records()))"
        ).text()
        if causes.count(killed) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert causes.count(killed) == 2, causes
    assert "SIGKILL" not in causes
    _usable(kernel)
    after = kernel.ok("%%mesh\nos.getpid()").text()
    assert after.splitlines()[1] == pids.splitlines()[1]  # rank 1 kept its process
    assert after.splitlines()[0] != pids.splitlines()[0]


def _blocking_cell_stop_says_what_mesh_why_says(kernel: Kernel) -> None:
    msg_id = kernel.execute(SKIP.format(options=""), wait=False)
    kernel.iopub_for(msg_id, _started)
    kernel.manager.interrupt_kernel()
    reply = kernel.collect(msg_id, timeout=120)
    assert reply.error["ename"] == "StuckRanksKilled"
    text = reply.traceback
    assert "did not stop within 1.0 s of the interrupt" in text
    assert "monarch_nb replaced rank(s) 0,2 with fresh processes" in text
    # Read from every rank, not only the busy ones: rank 1 is idle, and named.
    assert "rank 1 not in it: idle" in text
    assert VERDICT in text
    assert IDLE in text
    assert "every rank is in the collective" not in text
    _usable(kernel)


def _the_panels_interrupt_kills_and_replaces_too(kernel: Kernel) -> None:
    # The report: the panel's interrupt said "interrupted ranks [0, 2, 3]"
    # and the ranks stayed busy. Its button runs run_action("interrupt").
    msg_id = kernel.execute(SKIP.format(options=" --no-block"), wait=False)
    first = kernel.collect(msg_id).stream().count("started")
    kernel.iopub_for(msg_id, lambda ms: first + _text(ms).count("started") >= 3)
    _in_collective(kernel)
    said = kernel.ok(
        "from monarch_nb.magics._panel import run_action\n"
        "r = run_action('interrupt', 'm')\n"
        "print(r['ok'], r['message'])\n"
        "print(current_mesh().procs.busy_ranks())"
    ).text()
    assert said.startswith("True interrupted ranks [0, 2]; StuckRanksKilled: "), said
    assert "rank(s) 0,2 did not stop within 1.0 s of the interrupt" in said
    assert "monarch_nb replaced rank(s) 0,2 with fresh processes" in said
    assert said.splitlines()[-1] == "[]"  # nobody is left busy
    _usable(kernel)


def _verdicts(text: str) -> list[str]:
    return re.findall(r"→ [^\n<]*", plain(text))


def _failure_on_every_rank_prints_one_traceback(kernel: Kernel) -> None:
    reply = kernel.execute("%%mesh\nraise ValueError(f'bad value {rank % 2}')")
    assert reply.error["ename"] == "CellError"
    text = reply.traceback
    assert text.count("Traceback (most recent call last)") == 1
    assert "failed on rank(s) 0-2" in text
    assert "--- Traceback of where the remote call failed (rank 0-2):" in text
    assert re.search(r"ValueError: \[0,2\] bad value 0\n +\[1\] bad value 1", text), text
    # The dashboard's failure log folds them the same way: one entry.
    summary = kernel.ok(
        "from monarch_nb.magics import current_mesh\n"
        "from monarch_nb.widgets._model import fold_failures\n"
        "groups = fold_failures(current_mesh().failures.records())\n"
        "print([(g.ranks, g.record.cause) for g in groups if 'bad value' in g.record.cause])"
    ).text()
    assert "((0, 1, 2), 'ValueError: bad value" in summary
    assert "2 different messages" in summary


def _replay_shows_one_header_per_cell_and_hides_the_output(kernel: Kernel) -> None:
    kernel.ok("%%mesh\nprint('hello from', rank)")
    kernel.ok("%%mesh\nimport sys\nfor i in range(3):\n    print('step', i, file=sys.stderr)")
    kernel.ok("%%mesh\nz = rank * 10")
    kernel.ok("%%mesh\nprint(z)")
    kernel.ok("%%mesh\ndisplay(rank + 100)")  # a display (a figure, a widget) per rank

    reply = kernel.ok("%mesh restart --replay", timeout=120)
    text = reply.text()
    headers = re.findall(r"replaying \[[\d.]+\] \((\d)/5\)", text)
    assert headers == ["1", "2", "3", "4", "5"], text
    for shown_first_time in ("hello from", "step 0", "[0] 0", "[0] 100"):
        assert shown_first_time not in text
    assert "[0] 100" not in str(reply.outputs)
    assert "3 display(s)) is not shown again: --show-output shows it" in text
    assert kernel.ok("%%mesh\nz").text() == "[0] 0\n[1] 10\n[2] 20\n"

    skipping = kernel.ok("%mesh restart --replay --skip-display", timeout=120).text()
    # the two prints, the cell that showed z and the display: none builds state
    assert "skipped 4 cell(s) that only display" in skipping
    assert re.findall(r"\((\d)/2\)", skipping) == ["1", "2"]

    shown = kernel.ok("%mesh restart --replay --show-output", timeout=120).text()
    assert "hello from" in shown
    assert "replaying" in shown
    assert kernel.ok("%%mesh\nz").text() == "[0] 0\n[1] 10\n[2] 20\n"


def _text(messages: list) -> str:
    return "".join(m["content"].get("text", "") for m in messages if m["msg_type"] == "stream")
