"""ipywidgets and ``tqdm.notebook`` bars made on ranks, through a real kernel.

What a front end receives on iopub: a ``comm_open`` per widget model a rank
made (before the display that shows it), the rank's display naming that
model, and the rank's updates as ``comm_msg``; what the front end sends back
(a slider moved) changes the widget on that rank only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kernel_utils import Kernel

pytestmark = pytest.mark.timeout(180)
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    with Kernel() as k:
        k.ok("%load_ext monarch_nb")
        k.ok("%mesh start --procs 2 --name widgets --no-dashboard")
        yield k
        k.ok("%mesh stop --all")


def run(kernel: Kernel, code: str, timeout: float = 90) -> list[dict]:
    """Run ``code`` (it must succeed); every iopub message until the kernel is idle
    again, whatever its parent (the relay sends from monarch_nb's I/O thread)."""
    every: list[tuple[float, Any]] = []
    reply = kernel.collect(kernel.client.execute(code, store_history=False), timeout, every=every)
    assert reply.status == "ok", reply.text()
    return [m for _, m in every]


def opened(messages: list[dict], model: str) -> list[dict]:
    return [
        m["content"]
        for m in messages
        if m["msg_type"] == "comm_open"
        and m["content"]["target_name"] == "jupyter.widget"
        and m["content"]["data"]["state"].get("_model_name") == model
    ]


def test_a_slider_made_on_each_rank_shows_and_answers_the_notebook(kernel: Kernel) -> None:
    messages = run(
        kernel,
        "%%mesh\nimport ipywidgets\nslider = ipywidgets.IntSlider(value=10 + rank)\n"
        "display(slider)",
    )
    sliders = opened(messages, "IntSliderModel")
    assert sorted(s["data"]["state"]["value"] for s in sliders) == [10, 11]
    views = [
        (i, m["content"]["data"][WIDGET_VIEW]["model_id"])
        for i, m in enumerate(messages)
        if m["msg_type"] == "display_data" and WIDGET_VIEW in m["content"]["data"]
    ]
    comm_ids = {s["comm_id"] for s in sliders}
    assert {model for _, model in views} == comm_ids
    for position, model in views:  # the model exists before the view that shows it
        opened_at = next(
            i
            for i, m in enumerate(messages)
            if m["msg_type"] == "comm_open" and m["content"]["comm_id"] == model
        )
        assert opened_at < position
    # The notebook moves rank 0's slider: rank 0 sees it, rank 1 keeps its own.
    rank0 = next(s["comm_id"] for s in sliders if s["data"]["state"]["value"] == 10)
    client = kernel.client
    update = {"method": "update", "state": {"value": 42}, "buffer_paths": []}
    client.shell_channel.send(client.session.msg("comm_msg", {"comm_id": rank0, "data": update}))
    reply = kernel.ok("%%mesh\nprint('value', slider.value)")
    assert "[0] value 42" in reply.text()
    assert "[1] value 11" in reply.text()
    # A rank's change reaches the notebook as an update on the same comm.
    messages = run(kernel, "%%mesh --ranks 1\nslider.value = 7")
    updates = [
        m["content"]
        for m in messages
        if m["msg_type"] == "comm_msg" and m["content"]["data"].get("method") == "update"
    ]
    assert any(u["data"]["state"].get("value") == 7 for u in updates), updates
    assert {u["comm_id"] for u in updates} <= comm_ids - {rank0}


def test_tqdm_notebook_bars_from_ranks_are_progress_widgets(kernel: Kernel) -> None:
    messages = run(
        kernel,
        "%%mesh\nfrom tqdm.notebook import tqdm\n"
        "for _ in tqdm(range(5), desc=f'rank {rank}'):\n    pass",
    )
    bars = opened(messages, "FloatProgressModel") + opened(messages, "IntProgressModel")
    assert len(bars) == 2
    ids = {b["comm_id"] for b in bars}
    finished: dict[str, Any] = {}
    for m in messages:
        content = m["content"]
        if m["msg_type"] == "comm_msg" and content["comm_id"] in ids:
            state = content["data"].get("state", {})
            if "value" in state:
                finished[content["comm_id"]] = state["value"]
    assert sorted(finished.values()) == [5, 5], finished  # every bar reached the end


def sliders_made(kernel: Kernel, name: str) -> dict[int, str]:
    """A slider ``name`` made and shown on each rank: {rank: its comm id}."""
    messages = run(
        kernel,
        f"%%mesh\nimport ipywidgets\n{name} = ipywidgets.IntSlider(value=50 + rank)\n"
        f"display({name})",
    )
    return {
        s["data"]["state"]["value"] - 50: s["comm_id"] for s in opened(messages, "IntSliderModel")
    }


def send_from_notebook(kernel: Kernel, msg_type: str, content: dict) -> None:
    client = kernel.client
    client.shell_channel.send(client.session.msg(msg_type, content))


def test_what_an_observer_raises_is_printed_in_the_ranks_output(kernel: Kernel) -> None:
    ids = sliders_made(kernel, "watched")
    kernel.ok("%%mesh --ranks 0\nwatched.observe(lambda change: 1 / 0, names='value')")
    update = {"method": "update", "state": {"value": 5}, "buffer_paths": []}
    send_from_notebook(kernel, "comm_msg", {"comm_id": ids[0], "data": update})
    # The rank handles it between cells: the traceback is in its output.
    code = (
        "import time\nfrom monarch_nb import current_mesh\n"
        "deadline = time.monotonic() + 60\n"
        "def tail():\n"
        "    return '\\n'.join(o.line for o in current_mesh().procs.output_tail(0))\n"
        "while 'ZeroDivisionError' not in tail():\n"
        "    assert time.monotonic() < deadline, 'no traceback in the output of rank 0'\n"
        "    time.sleep(0.2)\n"
        "print('division by zero' in tail(), '<lambda>' in tail())"
    )
    # (The kernel shows it in the cell running meanwhile, here the one that waits.)
    assert kernel.ok(code, timeout=90).stream().endswith("True True\n")
    reply = kernel.ok("%%mesh\nprint('value', watched.value)")  # the rank goes on
    assert "[0] value 5" in reply.text()
    assert "[1] value 51" in reply.text()


def test_a_comm_the_notebook_closes_is_closed_on_the_rank(kernel: Kernel) -> None:
    ids = sliders_made(kernel, "closing")
    send_from_notebook(kernel, "comm_close", {"comm_id": ids[1], "data": {}})
    reply = kernel.ok(
        "%%mesh\nimport comm\n"
        "print('closed', comm.get_comm_manager().get_comm(closing.comm.comm_id) is None)"
    )
    assert "[1] closed True" in reply.text()
    assert "[0] closed False" in reply.text()
    # A change on the rank whose comm is closed sends nothing; the other's still does.
    messages = run(kernel, "%%mesh\nclosing.value = 1")
    updated = {m["content"]["comm_id"] for m in messages if m["msg_type"] == "comm_msg"}
    assert ids[0] in updated
    assert ids[1] not in updated


def test_a_restart_drops_the_old_ranks_widgets(kernel: Kernel) -> None:  # last: it restarts
    ids = sliders_made(kernel, "old")
    messages = run(kernel, "%mesh restart --mesh widgets --ranks 1")
    closed = {m["content"]["comm_id"] for m in messages if m["msg_type"] == "comm_close"}
    assert ids[1] in closed
    assert ids[0] not in closed  # rank 0 kept its process, and its widget
    messages = run(kernel, "%mesh restart --mesh widgets")
    closed = {m["content"]["comm_id"] for m in messages if m["msg_type"] == "comm_close"}
    assert ids[0] in closed
    # The new ranks make widgets of their own, relayed as before.
    assert len(sliders_made(kernel, "new")) == 2
    kernel.ok("%mesh stop --all")  # the processes this test started end with it
