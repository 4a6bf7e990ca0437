"""magics/_output.py and _frontend.py: rank output in the right cell, live or ordered."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest
from kernel_utils import Kernel, plain

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    with Kernel() as k:
        k.ok("%load_ext monarch_nb")
        k.ok("%mesh start --procs 2 --name m")
        yield k


def test_output_streams_while_the_cell_runs(kernel, tmp_path: Path):
    go = tmp_path / "go"
    msg_id = kernel.execute(
        "%%mesh\nimport os, time\nprint('waiting', rank, flush=True)\n"
        f"deadline = time.monotonic() + 30\nwhile not os.path.exists({str(go)!r}) "
        "and time.monotonic() < deadline:\n    time.sleep(0.01)\nprint('done', rank)",
        wait=False,
    )
    # Both ranks' first lines reach the notebook before the cell can finish.
    kernel.iopub_for(
        msg_id,
        lambda ms: (
            sum("waiting" in m["content"].get("text", "") for m in ms) >= 1
            and "".join(m["content"].get("text", "") for m in ms).count("waiting") == 2
        ),
    )
    go.touch()
    reply = kernel.collect(msg_id)
    assert reply.status == "ok"
    assert sorted(reply.stream().splitlines()) == ["[0] done 0", "[1] done 1"]
    # Live lines interleave: each rank's prefix has a colour of its own.
    raw = reply.raw_stream().splitlines()
    assert sorted(raw, key=plain) == ["\x1b[36m[0]\x1b[0m done 0", "\x1b[35m[1]\x1b[0m done 1"]


def test_a_failing_rank_is_named_in_the_cell_while_the_others_run(kernel, tmp_path: Path):
    go = tmp_path / "go"
    msg_id = kernel.execute(
        "%%mesh\nimport os, time\nif rank == 1:\n    raise ValueError('rank 1 broke')\n"
        f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.01)\nrank * 10",
        wait=False,
    )
    seen = kernel.iopub_for(
        msg_id, lambda ms: any("rank 1 broke" in m["content"].get("text", "") for m in ms)
    )
    line = next(m["content"] for m in seen if "rank 1 broke" in m["content"].get("text", ""))
    assert line["name"] == "stderr"
    assert line["text"] == (
        "[1] failed: ValueError: rank 1 broke (rank(s) 0 still running; traceback at the end)\n"
    )
    go.touch()  # rank 0 finishes only now: the line came while it ran
    reply = kernel.collect(msg_id)
    assert reply.status == "error"
    assert reply.error["ename"] == "CellError"
    text = reply.traceback
    assert "ValueError: rank 1 broke" in text
    assert text.endswith("--- rank(s) 0 succeeded; their values are in .values:\n[0] 0")
    assert kernel.ok("import sys\nprint(sys.last_value.values[0])").stream() == "0\n"


def test_ordered_mode_is_deterministic(kernel):
    cell = "%%mesh --ordered\nimport sys, time\ntime.sleep(0.05 * (1 - rank))\n"
    cell += "print('a', rank)\nprint('e', rank, file=sys.stderr)\nprint('b', rank)"
    reply = kernel.ok(cell)
    assert reply.raw_stream("stdout") == "[0] a 0\n[0] b 0\n[1] a 1\n[1] b 1\n"  # plain
    assert reply.stream("stderr") == "[0] e 0\n[1] e 1\n"
    assert kernel.ok(cell.replace("--ordered", "--group-by-rank")).stream() == reply.stream()


def test_deterministic_env_var_orders_every_cell():
    with Kernel(env={"MONARCH_NB_DETERMINISTIC": "1"}) as k:
        k.ok("%load_ext monarch_nb")
        k.ok("%mesh start --procs 3")
        reply = k.ok("%%mesh\nimport time\ntime.sleep(0.05 * (2 - rank))\nprint(rank)")
        assert reply.stream() == "[0] 0\n[1] 1\n[2] 2\n"
        reply = k.ok("%%mesh --live\nprint(rank)")
        assert sorted(reply.stream().splitlines()) == ["[0] 0", "[1] 1", "[2] 2"]


def test_progress_bars_stay_readable(kernel):
    cell = "%%mesh --ordered\nimport sys\nfor i in range(0, 101, 25):\n"
    cell += "    sys.stderr.write(f'\\r{i:3d}%|' + '#' * (i // 10))\nsys.stderr.write('\\n')"
    reply = kernel.ok(cell)
    assert reply.stream("stderr") == "[0] 100%|##########\n[1] 100%|##########\n"


def test_non_blocking_cell_writes_into_its_own_cell(kernel):
    first = kernel.execute(
        "%%mesh --no-block --out late\nimport time\ntime.sleep(0.5)\nprint('late', rank)\nrank",
        wait=False,
    )
    reply = kernel.collect(first)
    assert reply.status == "ok"
    assert "<%%mesh cell" in reply.displays()[0]["data"]["text/plain"]
    other = kernel.ok("print('other')")  # runs while the first cell's ranks work
    assert other.stream() == "other\n"
    late = kernel.iopub_for(first, lambda ms: any(m["msg_type"] == "display_data" for m in ms))
    text = "".join(m["content"].get("text", "") for m in late if m["msg_type"] == "stream")
    assert sorted(plain(text).splitlines()) == ["[0] late 0", "[1] late 1"]
    assert late[-1]["content"]["data"]["text/plain"] == "[0] 0\n[1] 1"
    assert kernel.ok("print(late.values())").stream() == "[0, 1]\n"


def test_non_blocking_error_is_shown_in_its_cell(kernel):
    first = kernel.execute("%%mesh --no-block\nimport time\ntime.sleep(0.3)\n1 / 0", wait=False)
    assert kernel.collect(first).status == "ok"  # the cell itself returned a handle
    late = kernel.iopub_for(first, lambda ms: any(m["msg_type"] == "stream" for m in ms))
    streams = [m for m in late if m["msg_type"] == "stream"]  # not the dashboard's comms
    assert "ZeroDivisionError" in streams[0]["content"]["text"]
    assert streams[0]["content"]["name"] == "stderr"


def test_rich_display_from_ranks_is_tagged(kernel):
    cell = "%%mesh --ordered\nclass Tag:\n    def _repr_html_(self):\n"
    cell += "        return f'<b>{rank}</b>'\ndisplay(Tag())"
    displays = kernel.ok(cell).displays()
    assert [d["metadata"]["monarch_nb"]["rank"] for d in displays] == [0, 1]
    assert displays[1]["data"]["text/html"].endswith("<b>1</b>")
    assert "[rank 1]" in displays[1]["data"]["text/html"]


def test_output_outside_cells_goes_to_the_running_cell(kernel):
    reply = kernel.ok(
        "from monarch_nb import Actor, endpoint\nfrom monarch_nb.magics import current_mesh\n"
        "class Talker(Actor):\n    @endpoint\n    def talk(self):\n        print('talking')\n"
        "t = current_mesh().spawn('t', Talker)\nt.talk.call().get(timeout=30)\n"
        "import time\nt0 = time.monotonic()\n"
        "while time.monotonic() - t0 < 0.5:\n    time.sleep(0.01)"  # let the lines arrive
    )
    assert sorted(reply.stream().splitlines()) == ["[0] talking", "[1] talking"]


def test_live_progress_bars_are_one_widget_display_in_rank_order(kernel):
    cell = "%%mesh --live\nimport sys, time\nfor i in range(0, 101, 50):\n"
    cell += "    sys.stderr.write(f'\\r{i:3d}%')\n    sys.stderr.flush()\n    time.sleep(0.05)\n"
    cell += "_ = sys.stderr.write('\\n')"
    reply = kernel.ok(cell)
    [first] = [m for m in reply.outputs if m["msg_type"] == "display_data"]
    updates = [m for m in reply.outputs if m["msg_type"] == "update_display_data"]
    display_id = first["content"]["transient"]["display_id"]
    assert {m["content"]["transient"]["display_id"] for m in updates} == {display_id}
    # The bars are widgets that the updates move; the display's text, sent as each
    # bar ends, lists every rank's last line in rank order.
    widget = "application/vnd.jupyter.widget-view+json"
    assert widget in first["content"]["data"]
    assert updates[-1]["content"]["data"]["text/plain"] == "[0] 100%\n[1] 100%"


def _figures(reply) -> dict[int, dict]:
    shown = [d for d in reply.displays() if "image/png" in d["data"]]
    return {d["metadata"]["monarch_nb"]["rank"]: d["data"] for d in shown}


def test_matplotlib_figures_from_ranks_are_shown_in_the_cell(kernel):
    reply = kernel.ok(
        "%%mesh\nimport matplotlib.pyplot as plt\nplt.plot([0, rank])\nplt.show()\n"
        "print('shown', len(plt.get_fignums()))"
    )
    figures = _figures(reply)
    assert sorted(figures) == [0, 1]  # one figure per rank, tagged with it
    assert base64.b64decode(figures[1]["image/png"]).startswith(b"\x89PNG")
    assert figures[1]["text/html"].startswith(
        '<div class="monarch-nb-rank"><small>[rank 1]</small></div><img src="data:image/png'
    )
    assert sorted(reply.stream().splitlines()) == ["[0] shown 0", "[1] shown 0"]  # closed
    # A figure as the last expression, and one left open: each shown once, as inline does.
    reply = kernel.ok("%%mesh\nfig, ax = plt.subplots()\nax.plot([1, 2])\nplt.figure()\nfig")
    assert len([d for d in reply.displays() if "image/png" in d["data"]]) == 4
    assert not [d for d in reply.displays() if "None" in d["data"]["text/plain"]]


def test_ipython_display_from_a_library_on_a_rank(kernel):
    reply = kernel.ok("%%mesh\nimport rich_library\nrich_library.report(rank)")
    html = sorted(d["data"]["text/html"] for d in reply.displays())
    assert html == [
        '<div class="monarch-nb-rank"><small>[rank 0]</small></div><b>report of rank 0</b>',
        '<div class="monarch-nb-rank"><small>[rank 1]</small></div><b>report of rank 1</b>',
    ]
    assert "IPython.core.display.HTML object" not in reply.stream()  # not printed
