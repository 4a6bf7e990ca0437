"""The dashboard through a real kernel (jupyter_client): what a front end receives.

The kernel's iopub channel carries the dashboard's display bundle and then
its widget updates (``comm_msg``), which must keep coming while a cell holds
the kernel's main thread.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from kernel_utils import Kernel, plain

pytestmark = pytest.mark.timeout(90)
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


@pytest.fixture
def kernel(kernel_session: Kernel) -> Iterator[Kernel]:
    """The module's kernel; every mesh a test started is stopped after it, pass or fail."""
    yield kernel_session
    kernel_session.ok("%mesh stop --all")


def run_collecting_comms(kernel: Kernel, code: str, timeout: float = 30) -> tuple[Any, list]:
    """Run ``code``; its Reply, its outputs and every widget update seen on iopub
    meanwhile, each as ``(seconds since the request, state)``. Updates come from the
    dashboard's own thread, so they are matched by type, not by parent."""
    every: list[tuple[float, Any]] = []
    reply = kernel.collect(kernel.client.execute(code, store_history=False), timeout, every=every)
    updates = [
        (t, m["content"]["data"]["state"])
        for t, m in every
        if m["msg_type"] == "comm_msg" and m["content"]["data"].get("method") == "update"
    ]
    return reply, reply.outputs, updates


def displays(outputs: list) -> list[dict]:
    return [m["content"]["data"] for m in outputs if m["msg_type"] == "display_data"]


def test_start_shows_the_dashboard_with_the_status_table_as_fallback(kernel: Kernel) -> None:
    reply = kernel.ok("%mesh start --procs 2 --name dash")
    [bundle] = [d for d in reply.displays() if WIDGET_VIEW in d["data"]]
    text = bundle["data"]["text/plain"]
    assert text.startswith("mesh 'dash' · running · 2 ranks · default")
    assert text.splitlines()[1].split() == [
        "rank",
        "host",
        "pid",
        "state",
        "current",
        "work",
        "cpu",
        "rss",
    ]
    assert "<table>" in bundle["data"]["text/html"]  # static exports show the table

    again = kernel.ok("%mesh dashboard")
    [bundle] = again.displays()
    assert WIDGET_VIEW in bundle["data"]
    assert bundle["data"]["text/plain"].startswith("mesh 'dash' · running")


def test_no_dashboard_shows_the_plain_status_table(kernel: Kernel) -> None:
    reply = kernel.ok("%mesh start --procs 1 --name table --no-dashboard")
    [bundle] = reply.displays()
    assert WIDGET_VIEW not in bundle["data"]
    assert bundle["data"]["text/plain"].startswith("mesh 'table' · running · 1 rank")


def test_updates_flow_while_a_cell_runs_with_progress_not_text(kernel: Kernel) -> None:
    kernel.ok("%mesh start --procs 2 --name live")
    # Ranks draw a tqdm-style bar for ~1.5 s while the kernel's main thread waits on them.
    cell = (
        "%%mesh\nimport sys, time\n"
        "for i in range(1, 6):\n"
        "    sys.stderr.write(f'\\r{i * 20}%|' + '#' * i + f'| {i}/5'); sys.stderr.flush()\n"
        "    time.sleep(0.3)\n"
    )
    reply, _, updates = run_collecting_comms(kernel, cell)
    assert reply.status == "ok"
    # HTML values (tiles); the cell's own progress widgets send numbers too.
    values = [state["value"] for _, state in updates if isinstance(state.get("value"), str)]
    busy = [v for v in values if "mnb-busy" in v]
    assert busy, f"no busy tile was sent while the cell ran: {values!r}"
    # Progress in the tile (at whichever steps a loaded machine let it draw).
    assert any(re.search(r"\| [1-5]/5|mnb-bar", v) for v in busy), busy
    # Throttled: a few redraws a second, not one per event.
    elapsed = max(t for t, _ in updates) - min(t for t, _ in updates) + 0.1
    assert len(updates) / elapsed < 40


def test_a_killed_rank_shows_dead_with_its_signal_within_a_second(kernel: Kernel) -> None:
    kernel.ok("%mesh start --procs 2 --name crash")
    code = (
        "from monarch_nb import current_mesh\n"
        "from monarch_nb.events import EventLog, RankFailed\n"
        "import time\n"
        "mesh = current_mesh()\n"
        "d = mesh.dashboard()\n"
        "log = EventLog()\n"
        "with mesh.procs.events.subscribe(log, kinds=(RankFailed,)):\n"
        "    mesh.procs.kill([1])\n"
        "    event = log.wait_for(RankFailed, timeout=10)\n"
        "shown = d.wait_until(lambda d: d.status.status.rank(1).state == 'dead'\n"
        "                     and 'SIGKILL' in d.grid.tile(1), timeout=5)\n"
        "print(shown, round(time.time() - event.at, 3))\n"
        "print(d.text())\n"
    )
    reply, outputs, updates = run_collecting_comms(kernel, code)
    assert reply.status == "ok"
    out = plain(
        "".join(
            m["content"]["text"]
            for m in outputs
            if m["msg_type"] == "stream" and m["content"]["name"] == "stdout"
        )
    )
    first, *summary = out.splitlines()
    shown, delay = first.split()
    assert shown == "True"
    assert float(delay) < 1.0
    text = "\n".join(summary)
    assert "1     vm" in text or " dead " in text
    assert [line.split()[3] for line in summary if line.startswith("1 ")] == ["dead"]
    assert "rank 1 · " in text
    assert text.rstrip().endswith("was killed by signal SIGKILL")
    # The browser was sent the same: rank 1's tile, red, naming the signal.
    dead_tiles = [s["value"] for _, s in updates if "mnb-dead" in s.get("value", "")]
    assert dead_tiles
    assert "SIGKILL" in dead_tiles[-1]


def test_a_straggler_is_marked_on_its_tile(kernel: Kernel) -> None:
    kernel.ok("%mesh start --procs 3 --name slow")
    kernel.ok("from monarch_nb import current_mesh\nd = current_mesh().dashboard()")
    # One step where rank 2 takes far longer than the median rank (1.5x, 0.1 s).
    kernel.ok("%%mesh\nimport time\ntime.sleep(1.5 if rank == 2 else 0.05)")
    out = kernel.ok(
        "print(d.wait_until(lambda d: 'slow ' in d.grid.tile(2), timeout=20))\n"
        "print(sorted(d.stragglers), 'slow ' in d.grid.tile(0) + d.grid.tile(1))\n"
        "print(d.stragglers[2])"
    )
    shown, marked, why = plain(out.stream("stdout")).splitlines()[-3:]
    assert shown == "True"
    assert marked == "[2] False"
    assert why.startswith("rank 2 took ")
    assert "the median" in why


def test_failures_fold_by_rank_set_and_clear_and_interrupts_are_not_listed(
    kernel: Kernel,
) -> None:
    kernel.ok("%mesh start --procs 3 --name folds")
    kernel.ok("from monarch_nb import current_mesh\nd = current_mesh().dashboard()")
    assert kernel.execute("%%mesh\nraise ValueError('same everywhere')").status == "error"
    # An interrupt (here: a timeout) is a stop, not a failure: neither listed nor a red tile.
    assert kernel.execute("%%mesh --timeout 0.5\nimport time\ntime.sleep(60)").status == "error"
    code = (
        "shown = d.wait_until(lambda d: 'ranks 0-2' in d.failures.list.value\n"
        "                     and all(r.state == 'idle' for r in d.status.ranks), timeout=10)\n"
        "print(shown, d.failures.list.value.count('class=\"mnb-failure\"'),\n"
        "      len(d.failure_records), 'KeyboardInterrupt' in d.failures.list.value)\n"
        "d.failures.clear_button.click()\n"
        "print(d.wait_until(lambda d: 'no failures' in d.failures.list.value, timeout=10),\n"
        "      current_mesh().failures.records(), d.failures.clear_button.layout.display)"
    )
    out = plain(kernel.ok(code).stream())
    assert out == "True 1 3 False\nTrue () none\n"


def test_the_output_box_searches_the_picked_ranks_log(kernel: Kernel) -> None:
    kernel.ok("%mesh start --procs 2 --name search")
    kernel.ok("%%mesh\nfor i in range(3):\n    print(f'needle {i} on {rank}' if i == 1 else 'hay')")
    code = (
        "from monarch_nb import current_mesh\n"
        "d = current_mesh().dashboard()\n"
        "d.show_output(1)\n"
        "print('hay' in d.failures.output.value)\n"
        "d.failures.search.value = 'needle'\n"
        "box = d.failures.output.value\n"
        "print('needle 1 on 1' in box, 'hay' in box, 'on 0' in box)\n"
        "d.failures.update(d.failure_records)  # a redraw keeps the result\n"
        "print(d.failures.output.value == box)\n"
        "d.failures.search.value = '('\n"
        "print('not a regular expression' in d.failures.output.value)\n"
        "d.failures.search.value = ''\n"
        "print('hay' in d.failures.output.value)\n"
        "d.close()"
    )
    assert plain(kernel.ok(code).stream()) == "True\nTrue False False\nTrue\nTrue\nTrue\n"


def test_plain_ipython_shows_the_text_summary() -> None:
    source = "%load_ext monarch_nb\n%mesh start --procs 1 --name term\n%mesh dashboard\n%mesh stop"
    result = subprocess.run(
        [sys.executable, "-m", "IPython", "--no-banner", "--colors=NoColor", "-c", source],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("mesh 'term' · running · 1 rank") == 2
    assert "mesh 'term' stopped" in result.stdout
    assert "Widget" not in result.stdout + result.stderr


def test_the_dashboard_follows_the_mesh_across_restarts(kernel: Kernel) -> None:
    kernel.ok("%mesh start --procs 2 --name again")
    code = (
        "from monarch_nb import current_mesh\n"
        "mesh = current_mesh()\n"
        "d = mesh.dashboard()\n"
        "mesh.procs.kill([1])\n"
        "mesh.restart()\n"  # every process
        "def showing(d, pids):\n"
        "    return (d.status.status.state == 'running'\n"
        "            and [r.pid for r in d.status.status.ranks] == pids)\n"
        "print(d.wait_until(lambda d: showing(d, mesh.procs.pids), timeout=30))\n"
        "mesh.restart('1')\n"  # one rank
        "print(d.wait_until(lambda d: showing(d, mesh.procs.pids), timeout=30))\n"
        "print(d.finished)\n"
    )
    reply, outputs, _ = run_collecting_comms(kernel, code, timeout=90)
    assert reply.status == "ok", outputs
    out = "".join(
        m["content"]["text"]
        for m in outputs
        if m["msg_type"] == "stream" and m["content"]["name"] == "stdout"
    )
    assert out.split() == ["True", "True", "False"]  # still live, with the new pids
    # %mesh restart shows a live dashboard, not a table.
    reply, outputs, _ = run_collecting_comms(kernel, "%mesh restart", timeout=90)
    assert reply.status == "ok"
    assert any(WIDGET_VIEW in data for data in displays(outputs))


def test_tiles_draw_a_sparkline_and_the_chart_a_line_per_rank(kernel: Kernel) -> None:
    kernel.ok("%mesh start --procs 3 --name history")
    kernel.ok("from monarch_nb import current_mesh\nd = current_mesh().dashboard()")
    # Rank 1 spins for a few heartbeats; the others sleep; then each logs a loss.
    kernel.ok(
        "%%mesh\nimport time, monarch_nb\nend = time.monotonic() + 4\n"
        "while rank == 1 and time.monotonic() < end:\n    pass\n"
        "time.sleep(0 if rank == 1 else 4)\n"
        "for step in range(6):\n    monarch_nb.log_metric('loss', 1 / (step + 1 + rank), step=step)"
    )
    code = (
        "import re\n"
        "def level(rank):  # the highest block of the rank's cpu sparkline, 0-7\n"
        "    found = re.search(r'mnb-spark[^>]*>cpu ([^<]*)<', d.grid.tile(rank))\n"
        "    return max('▁▂▃▄▅▆▇█'.find(c) for c in found.group(1)) if found else -1\n"
        "busy = lambda d: level(1) >= 2 and 0 <= level(0) < level(1)\n"
        "print(d.wait_until(lambda d: busy(d) and d.chart and d.chart.sent, timeout=30))\n"
        "print(d.chart.lines.labels, d.chart.value_axis.label)\n"
        "print(d.wait_until(lambda d: 'loss' in d.metric_picker.options, timeout=30))\n"
        "d.metric_picker.value = 'loss'\n"
        "print(d.wait_until(lambda d: all('loss ' in d.grid.tile(r) for r in range(3))\n"
        "                   and len(d.chart.lines.labels) == 3, timeout=30))\n"
        "print(d.chart.lines.x.tolist()[0], d.chart.lines.y[2].round(3).tolist())\n"
        "print(d.chart.value_axis.label, d.grid.tile(0).count('mnb-spark'))\n"
        "d.close()"
    )
    lines = plain(kernel.ok(code, timeout=120).stream("stdout")).splitlines()
    assert lines[0] == "True"
    assert lines[1] == "['rank 0', 'rank 1', 'rank 2'] cpu_percent"
    assert lines[2] == "True"
    assert lines[3] == "True"
    # A logged metric is drawn along its steps, a line per rank.
    assert lines[4] == "[0.0, 1.0, 2.0, 3.0, 4.0, 5.0] [0.333, 0.25, 0.2, 0.167, 0.143, 0.125]"
    assert lines[5] == "loss 1"
