"""Cells: compiling cells, rank namespaces, rich display and await on ranks."""

from __future__ import annotations

import base64
import threading

import pytest

from monarch_nb import CellError, MeshFailure, RemoteError
from monarch_nb._controller._cells import pull, push, run_cell
from monarch_nb._controller._interrupt import fail_fast
from monarch_nb._runtime._cell_source import compile_cell
from monarch_nb._worker._namespace import mime_bundle
from monarch_nb.events import DisplayData, EventLog, RankFailed

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


def test_an_error_keeps_the_values_of_the_ranks_that_succeeded(procs4):
    with pytest.raises(CellError) as info:
        run_cell(procs4, "if rank == 2:\n    raise ValueError('boom')\nrank * 10").get(timeout=30)
    error = info.value
    assert error.ranks == (2,)
    assert error.values is not None
    assert [(p.rank, v) for p, v in error.values] == [(0, 0), (1, 10), (3, 30)]
    assert error.values[3] == 30
    text = error.render()
    assert text.endswith(
        "--- rank(s) 0-1,3 succeeded; their values are in .values:\n[0] 0\n[1] 10\n[3] 30"
    )
    with pytest.raises(CellError) as info:
        run_cell(procs4, "raise ValueError(rank)").get(timeout=30)
    assert info.value.values is None
    assert "succeeded" not in info.value.render()


# Ranks 0, 1 and 3 sleep (long past the test's timeout) until interrupted; rank 2
# raises once the others are asleep (each wrote its file), so none is still queued.
_SLEEP_UNTIL_RANK_2_FAILS = """
import os, pathlib, time
if rank == 2:
    while len(list(pathlib.Path({dir!r}).iterdir())) < 3:
        time.sleep(0.01)
    raise ValueError('rank 2 failed')
pathlib.Path({dir!r}, str(rank)).touch()
time.sleep(600)
"""


def test_fail_fast_interrupts_the_other_ranks_at_the_first_failure(procs4, tmp_path):
    future = run_cell(procs4, _SLEEP_UNTIL_RANK_2_FAILS.format(dir=str(tmp_path)), fail_fast=True)
    error = future.exception(timeout=30)
    assert isinstance(error, CellError)
    assert error.ranks == (0, 1, 2, 3)
    assert error.interrupted == (0, 1, 3)
    assert [ranks for ranks, _ in error.groups()] == [(2,)]
    text = error.render()
    assert text.count("Traceback (most recent call last)") == 1
    assert "--- rank(s) 0-1,3 were interrupted (KeyboardInterrupt) and did not finish" in text
    assert str(error).endswith("ValueError: rank 2 failed (rank(s) 0-1,3 interrupted)")
    assert run_cell(procs4, "rank").get(timeout=30).values() == [0, 1, 2, 3]  # still usable


def test_fail_fast_kills_a_rank_that_does_not_stop(procs2, tmp_path):
    source = f"""
import pathlib, time
if rank == 0:
    while not pathlib.Path({str(tmp_path)!r}, 'in').exists():
        time.sleep(0.01)
    raise ValueError('rank 0 failed')
pathlib.Path({str(tmp_path)!r}, 'in').touch()
while True:  # ignores interrupts, as a rank stuck in C code would
    try:
        time.sleep(600)
    except KeyboardInterrupt:
        pass
"""
    log = EventLog()
    procs2.events.subscribe(log, kinds=(RankFailed,))
    future = run_cell(procs2, source)
    fail_fast(future, grace=0.5)
    error = future.exception(timeout=30)
    assert isinstance(error, MeshFailure)
    assert error.ranks == (1,)
    assert "failed on rank 0 (ValueError: rank 0 failed); fail-fast interrupted rank(s) 1" in str(
        error
    )
    assert "did not stop within 0.5 s" in str(error)
    assert isinstance(error.cause, CellError)
    assert error.cause.ranks == (0,)
    log.wait_for(RankFailed, lambda e: e.rank == 1, timeout=30)  # once its exit is seen
    assert procs2.state == "failed"  # the whole mesh, with a rank dead
    assert "restart(ranks=[1]) on process mesh 'procs' to replace the killed" in str(error)
    assert run_cell(procs2.healthy(), "rank").get(timeout=30).values() == [0]  # kept its state


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
