"""Accumulator: an endpoint's replies from every actor, folded into one value."""

import asyncio
import operator

import pytest

from monarch_nb import MeshUsageError, RemoteError
from monarch_nb.actor import Accumulator, Actor, current_rank, current_size, endpoint


class Counter(Actor):
    def __init__(self, start: int) -> None:
        self.value = start

    @endpoint
    def incr(self) -> None:
        self.value += 1

    @endpoint
    def get(self) -> int:
        return self.value

    @endpoint
    def run(self, fn):
        return fn()

    @endpoint
    def letter(self) -> str:
        return "ab"[current_rank().rank]

    @endpoint
    def fail_on(self, rank: int) -> int:
        if current_rank().rank == rank:
            raise ValueError(f"rank {rank} fails")
        return 1


def test_accumulate_folds_every_actors_reply(procs2):
    counters = procs2.spawn("counters", Counter, 1)
    counters.incr.broadcast()
    assert Accumulator(counters.get, 0, operator.add).accumulate().get(timeout=60) == 4
    # Arguments go to the endpoint; a slice's endpoint folds that slice.
    acc = Accumulator(counters.run, 0, operator.add)
    assert acc.accumulate(lambda: current_rank()["procs"]).get(timeout=60) == 1
    assert acc.accumulate(lambda: current_size()["procs"]).get(timeout=60) == 4
    one = Accumulator(counters.slice(procs=1).get, 10, operator.add)
    assert one.accumulate().get(timeout=60) == 12
    # In rank order, so a fold that is not commutative has one answer.
    assert Accumulator(counters.letter, "", operator.add).accumulate().get(timeout=60) == "ab"

    async def awaited() -> int:
        return await Accumulator(counters.get, 0, max).accumulate()

    assert asyncio.run(awaited()) == 2


def test_a_failing_rank_or_combine_fails_the_future(procs2):
    counters = procs2.spawn("counters", Counter, 0)
    with pytest.raises(RemoteError, match="rank 1 fails"):
        Accumulator(counters.fail_on, 0, operator.add).accumulate(1).get(timeout=60)
    with pytest.raises(TypeError, match="unsupported operand"):
        Accumulator(counters.get, None, operator.add).accumulate().get(timeout=60)


def test_an_endpoint_of_a_mesh_is_needed():
    with pytest.raises(MeshUsageError, match=r"not Accumulator\(Counter.value, ...\)"):
        Accumulator(Counter.get, 0, operator.add)
    with pytest.raises(MeshUsageError, match="combine must be a function"):
        Accumulator(Counter.get, 0, 3)  # type: ignore[arg-type]


class _Streams:
    """Anything with Monarch's ``stream()`` (a stand-in, a wrapper of an endpoint)."""

    def __init__(self, items: list) -> None:
        self.items = items
        self.asked: list = []

    def stream(self, *args, **kwargs):
        self.asked.append((args, kwargs))
        return iter(self.items)


def test_anything_with_stream_is_folded_in_its_order():
    assert Accumulator(_Streams([]), 42, operator.add).accumulate().get(timeout=1) == 42
    streams = _Streams([(0, "a"), (1, "b")])
    folded = Accumulator(streams, "", operator.add).accumulate(1, k=2).get(timeout=1)
    assert (folded, streams.asked) == ("ab", [((1,), {"k": 2})])
    with pytest.raises(TypeError, match="unsupported operand"):
        Accumulator(_Streams([(0, "a")]), 0, operator.add).accumulate().get(timeout=1)
