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
