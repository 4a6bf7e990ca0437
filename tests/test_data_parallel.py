"""_controller/_data_parallel.py and _runtime/_balance.py: scatter, gather and map."""

from __future__ import annotations

import threading

import pytest
import torch

from monarch_nb import Actor, MeshUsageError, RemoteError, endpoint
from monarch_nb._controller._data_parallel import concatenate
from monarch_nb._runtime._balance import split_bounds

pytestmark = pytest.mark.timeout(60)


class Square(Actor):
    @endpoint
    def square(self, x: int) -> int:
        if x < 0:
            raise ValueError(f"negative: {x}")
        return x * x


def test_split_bounds_gives_the_first_ranks_one_more():
    assert split_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert split_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    assert split_bounds(0, 2) == [(0, 0), (0, 0)]


def test_scatter_then_gather_round_trips(procs4):
    procs4.scatter("shard", list(range(10)))
    assert procs4.pull("shard").values() == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    assert procs4.gather("shard") == list(range(10))
    procs4.scatter("word", "abcde")
    assert procs4.gather("word") == "abcde"
    procs4.scatter("t", torch.arange(12.0).reshape(6, 2))
    assert [tuple(t.shape) for t in procs4.pull("t").values()] == [(2, 2), (2, 2), (1, 2), (1, 2)]
    assert torch.equal(procs4.gather("t"), torch.arange(12.0).reshape(6, 2))


def test_scatter_on_a_view_and_its_misuse(procs4):
    view = procs4.slice(procs=slice(2, 4))
    view.scatter("part", (1, 2, 3))
    assert view.pull("part").values() == [(1, 2), (3,)]
    assert view.gather("part") == (1, 2, 3)
    with pytest.raises(MeshUsageError, match=r"splits something with len\(\) and slicing"):
        procs4.scatter("x", 5)
    with pytest.raises(MeshUsageError, match=r"needs a Python name .* got '1x'"):
        procs4.scatter("1x", [1])


def test_gather_concatenates_by_type():
    assert concatenate([[1], [2, 3]]) == [1, 2, 3]
    assert concatenate([torch.tensor(1.0), torch.tensor(2.0)]).tolist() == [1.0, 2.0]
    assert concatenate([1, 2]) == [1, 2]  # not sequences: a list in rank order
    assert concatenate([[1], (2,)]) == [[1], (2,)]  # mixed types are not joined


def test_map_returns_results_in_input_order(procs4):
    assert procs4.map(lambda x: x * 10, range(25)).get(timeout=30) == [x * 10 for x in range(25)]
    assert procs4.map(abs, []).get(timeout=30) == []


def test_map_is_load_balanced(procs4, tmp_path):
    """Rank 0's items wait for a file written once every other item is done: it takes
    exactly the two items it was first given, the other ranks take the rest."""
    release = tmp_path / "release"
    others_done = threading.Event()

    def work(item):
        import os
        import pathlib
        import time

        rank = int(os.environ["RANK"])
        while rank == 0 and not pathlib.Path(release).exists():
            time.sleep(0.01)
        return item, rank

    future = procs4.map(work, range(20))
    future.on_progress = lambda done, total: done >= total - 2 and others_done.set()
    if future.done_count >= 18:  # they were done before the callback was set
        others_done.set()
    assert others_done.wait(30)
    release.touch()
    results = future.get(timeout=30)
    assert [item for item, _ in results] == list(range(20))
    assert sum(rank == 0 for _, rank in results) == 2


def test_endpoint_map_and_its_first_error(procs4):
    squares = procs4.spawn("squares", Square)
    assert squares.square.map(range(9)).get(timeout=30) == [x * x for x in range(9)]
    with pytest.raises(RemoteError, match="negative: -1"):
        squares.square.map([1, -1, 2]).get(timeout=30)
    with pytest.raises(RemoteError, match="ZeroDivisionError"):
        procs4.map(lambda x: 1 / x, [1, 0]).get(timeout=30)
