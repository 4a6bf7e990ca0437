"""Replies folded on the way up (``Accumulator(ep, identity, "sum")``), with real
local agents: every "host" is this machine and "ssh" runs the agent locally, as
in test_agent_tree.py; the tree links between agents are real CURVE sockets."""

from __future__ import annotations

import os
import signal
import sys
import time

import cloudpickle
import pytest
from local_hosts import tree_procs

from monarch_nb import Actor, MeshFailure, MeshUsageError, RemoteError, endpoint
from monarch_nb._model._reducers import Partial
from monarch_nb.actor import Accumulator, current_rank, this_host

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Replier(Actor):
    def __init__(self) -> None:
        self.rank = current_rank().rank

    @endpoint
    def value(self, kind: str) -> object:
        r = self.rank
        if kind == "fail" and r in (1, 7):
            raise ValueError(f"rank {r} refused")
        return {
            "int": r + 1,
            "float": 0.1 * (r + 1),
            "same": 7,
            "big": 10**30 + r,
            "list": [r] if r == 3 else r,
            "nan": float("nan") if r == 5 else 1.0,
        }.get(kind, 0)

    @endpoint
    def nap(self, seconds: float) -> int:
        time.sleep(seconds)
        return 1


CASES = [(r, k) for r in ("sum", "min", "max") for k in ("int", "float", "big", "nan")]
CASES += [("equal", "same"), ("equal", "int"), ("sum", "fail"), ("sum", "list")]


def outcomes(actors) -> list[str]:
    found = []
    for reducer, kind in CASES:
        try:
            got = Accumulator(actors.value, None, reducer).accumulate(kind).get(timeout=60)
            found.append(f"{reducer} {kind}: {got!r}")
        except Exception as exc:
            found.append(f"{reducer} {kind}: {type(exc).__name__}: {exc}")
    return found


@pytest.fixture(scope="module")
def tree_actors():
    # fan-out 2 over 5 hosts, 2 ranks each: the controller sends to h0 (which
    # relays to h1) and h2 (to h3 and h4): two levels, two folds come back.
    with tree_procs(5, per_host=2) as (_, procs):
        yield procs.spawn("replier", Replier)


def covered(actors) -> list[tuple[int, ...]]:
    """The ranks each fold of a reduced call to all of ``actors`` covers (the plans
    the controller keeps; a call's own record empties as its folds come)."""
    tree = actors._group.agents.tree
    ((_, plans),) = [v for k, v in tree.fold_plans.items() if k[1] == actors._shape.ranks]
    return sorted(ranks for _, _, ranks in plans)


def test_the_agents_fold_and_the_controller_reads_one_fold_per_subtree(tree_actors) -> None:
    call = tree_actors.value._send(tree_actors._shape, "fold:sum", ("int",), {})
    partial = call.future.get(timeout=60)
    assert partial.finish(None) == sum(range(1, 11))
    # two subtree roots, each covering its subtree's ranks, both folds counted
    assert covered(tree_actors) == [(0, 1, 2, 3), (4, 5, 6, 7, 8, 9)]
    assert call.covers == {}
    assert partial.count == 10
    # a value no agent folds (a list) comes up on its own: the rank, by name
    call = tree_actors.value._send(tree_actors._shape, "fold:sum", ("list",), {})
    with pytest.raises(RemoteError, match="rank 3") as info:
        call.future.get(timeout=60)
    assert call.covers == {}
    assert tuple(info.value.ranks) == (3,)
    # without a tree, each host's agent folds its own ranks: a fold per host
    tree = tree_actors._group.agents.tree
    tree.set_fanout("0")
    try:
        call = tree_actors.value._send(tree_actors._shape, "fold:max", ("int",), {})
        assert call.future.get(timeout=60).finish(None) == 10
        assert covered(tree_actors) == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]
        assert call.covers == {}
    finally:
        tree.set_fanout("2")


def test_a_tree_folds_as_one_host_does(tree_actors) -> None:
    procs = this_host().spawn_procs({"procs": 10})
    try:
        local = outcomes(procs.spawn("replier", Replier))
    finally:
        procs.stop()
    tree = outcomes(tree_actors)
    assert tree == local
    got = dict(line.split(": ", 1) for line in tree)
    assert got["sum int"] == "55"
    assert got["sum float"] == repr(float(sum(_exact(0.1 * (r + 1)) for r in range(10))))
    assert got["sum big"] == str(10 * 10**30 + 45)
    assert got["min nan"] == got["sum nan"] == "nan"
    assert got["equal same"] == "7"
    assert got["equal int"].startswith("ValueError: the reducer 'equal' got 10 different values")
    # failures are never folded away: each failing rank is named, grouped as call() does
    assert got["sum fail"].startswith("RemoteError: Replier.value failed on ranks 1,7")
    assert "TypeError" in got["sum list"]
    assert "rank 3" in got["sum list"]


def _exact(value: float):
    from fractions import Fraction

    return Fraction(value)


def test_identity_and_bad_reducers() -> None:
    partial = Partial("sum")
    partial.add(0, 1)
    assert partial.finish(10) == 11
    assert Partial.from_json(partial.to_json()).finish(0.5) == 1.5
    with pytest.raises(MeshUsageError, match="'mean' is not a reducer"):
        Accumulator(Replier.value, 0, "mean")  # type: ignore[arg-type]
    for bad in (b"[]", b'["sum",1,[1,0,false,false,false,false]]', b'["min",1,["x",0,false]]'):
        with pytest.raises(ValueError, match="not a folded reply"):
            Partial.from_json(bad)


def test_an_intermediate_agent_killed_mid_reduction_fails_the_call_naming_it() -> None:
    # fan-out 2 over 4 hosts: h2 relays casts to h3, and folds h3's replies.
    with tree_procs(4) as (hosts, procs):
        actors = procs.spawn("replier", Replier)
        agents = hosts._agents.agents
        assert Accumulator(actors.value, 0, "sum").accumulate("int").get(timeout=60) == 10
        relay = agents[2].pid
        os.kill(relay, signal.SIGSTOP)  # it holds the reduced cast for h3 ...
        total = Accumulator(actors.value, 0, "sum").accumulate("int")
        os.kill(relay, signal.SIGKILL)  # ... and dies with it
        started = time.monotonic()
        with pytest.raises(MeshFailure, match=r"host h2 ") as info:
            total.get(timeout=30)
        # the launcher's exit, at once; nowhere near the 5 s heartbeat timeout
        assert time.monotonic() - started < 4.0
        assert set(info.value.ranks) & {2, 3}
        # the tree is rebuilt around h2: the rest still folds
        rest = actors.slice(hosts=slice(0, 2))
        assert Accumulator(rest.value, 0, "sum").accumulate("int").get(timeout=60) == 3


def test_a_rank_killed_mid_reduction_fails_the_call_naming_it() -> None:
    # fan-out 2 over 3 hosts: h1 relays to h2 and folds its replies.
    with tree_procs(3) as (_, procs):
        actors = procs.spawn("replier", Replier)
        assert Accumulator(actors.value, 0, "sum").accumulate("int").get(timeout=60) == 6
        napping = Accumulator(actors.nap, 0, "sum").accumulate(60)
        os.kill(procs.pids[2], signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(MeshFailure, match="rank 2") as info:
            napping.get(timeout=30)
        assert time.monotonic() - started < 4.0  # its agent's pidfd, at once
        assert 2 in info.value.ranks
