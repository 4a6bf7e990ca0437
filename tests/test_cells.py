"""Cells: compiling cells, rank namespaces, rich display and await on ranks."""

from __future__ import annotations

import base64
import threading

import pytest

from monarch_nb import RemoteError
from monarch_nb._common._cell_source import compile_cell
from monarch_nb._controller._cells import pull, push, run_cell
from monarch_nb._worker._namespace import mime_bundle
from monarch_nb.events import DisplayData

pytestmark = pytest.mark.timeout(60)


def test_compile_splits_the_trailing_expression():
    _body, expr = compile_cell("x = 1\nx + 1", "<c>")
    assert expr is not None
    assert compile_cell("x = 1", "<c>")[1] is None
    with pytest.raises(SyntaxError):
        compile_cell("x = (", "<c>")


def test_top_level_await_compiles():
    compile_cell("import asyncio\nawait asyncio.sleep(0)", "<c>")


def test_namespace_predefines_rank_names(procs4):
    values = run_cell(procs4, "rank, world_size, local_rank, point.rank").get(timeout=30)
    assert values.values() == [(r, 4, r, r) for r in range(4)]
    assert run_cell(procs4, "callable(display)").get(timeout=30).values() == [True] * 4


def test_top_level_await_runs_on_ranks(procs4):
    source = (
        "import asyncio\nasync def f():\n    return rank + 1\nawait asyncio.sleep(0)\nawait f()"
    )
    assert run_cell(procs4, source).get(timeout=30).values() == [1, 2, 3, 4]


def test_push_then_pull(procs4):
    push(procs4, {"shared": {"k": 1}}).get(timeout=30)
    assert pull(procs4, "shared").get(timeout=30).values() == [{"k": 1}] * 4


def test_remote_traceback_shows_the_cell_source(procs4):
    with pytest.raises(RemoteError) as info:
        run_cell(procs4, "x = 1\nraise ValueError(f'bad {rank}')", name="<cell-t>").get(timeout=30)
    text = info.value.render()
    assert 'File "<cell-t>", line 2' in text
    assert "raise ValueError(f'bad {rank}')" in text


def test_display_sends_a_tagged_bundle_event(procs4):
    seen: list = []
    done = threading.Event()

    def listener(event):
        seen.append(event)
        if len(seen) == 4:
            done.set()

    source = "class H:\n    def _repr_html_(self):\n        return f'<i>{rank}</i>'\ndisplay(H())"
    with procs4.events.subscribe(listener, kinds=(DisplayData,)):
        run_cell(procs4, source).get(timeout=30)
        assert done.wait(10)
    by_rank = {event.rank: event for event in seen}
    assert by_rank[2].data["text/html"] == "<i>2</i>"


def test_mime_bundle_prefers_rich_reprs_and_encodes_images():
    class Pic:
        def _repr_png_(self):
            return b"\x89PNG"

        def _repr_mimebundle_(self):
            return {"text/markdown": "*m*"}

    data, _ = mime_bundle(Pic())
    assert data["text/markdown"] == "*m*"
    assert base64.b64decode(data["image/png"]) == b"\x89PNG"
    assert "text/plain" in data
    assert mime_bundle(3) == ({"text/plain": "3"}, {})
