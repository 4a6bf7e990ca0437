"""Recovery figures: from a rank's SIGKILL to the mesh usable again, beside a fresh
``spawn_procs`` of the same size measured in the same run (the floor a restart
cannot beat by much: it starts processes too).

Run: ``python benchmarks/bench_recovery.py [--quick] [--procs 4] [--cells 20]``.

Rows (median of the trials, min and max beside it):
- the survivors answering through ``healthy()`` after the kill (no restart);
- ``restart(ranks=[1])``: one new process, its actors spawned again, every rank answering;
- ``restart(replay=True)``: every process new, then a history of ``--cells`` cells
  (and one push, one spawn) sent again, every rank answering.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable

import cloudpickle

from monarch_nb import Actor, current_rank, endpoint, this_host
from monarch_nb.events import EventLog, RankStateChanged

# Workers cannot import benchmarks/: send this module's actors by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Holder(Actor):
    def __init__(self, value: int) -> None:
        self.value = value

    @endpoint
    def get(self) -> tuple[int, int]:
        return current_rank().rank, self.value


def _kill(procs, rank: int) -> float:
    """SIGKILL ``rank``; the perf_counter at the kill, once the controller saw it die."""
    log = EventLog()
    with procs.events.subscribe(log, kinds=(RankStateChanged,)):
        t0 = time.perf_counter()
        os.kill(procs.pids[rank], signal.SIGKILL)
        log.wait_for(RankStateChanged, lambda e: e.rank == rank and e.state == "dead", timeout=60)
    return t0


def _build(procs, cells: int):
    procs.push(base=1)
    holders = procs.spawn("holders", Holder, 7)
    for i in range(cells):
        procs.run(f"total = {'base' if i == 0 else 'total'} + {i}")
    return holders


def _fresh(n: int) -> float:
    t0 = time.perf_counter()
    procs = this_host().spawn_procs(per_host={"procs": n})
    procs.run("rank")
    elapsed = time.perf_counter() - t0
    procs.stop()
    return elapsed


def _survivors(n: int, cells: int) -> float:
    with this_host().spawn_procs(per_host={"procs": n}) as procs:
        _build(procs, cells)
        t0 = _kill(procs, 1)
        procs.healthy().run("total")
        return time.perf_counter() - t0


def _one_rank(n: int, cells: int) -> float:
    with this_host().spawn_procs(per_host={"procs": n}) as procs:
        holders = _build(procs, cells)
        t0 = _kill(procs, 1)
        procs.restart(ranks=[1])
        holders.get.call().get(timeout=60)
        procs.run("rank")
        return time.perf_counter() - t0


def _replay_all(n: int, cells: int) -> float:
    with this_host().spawn_procs(per_host={"procs": n}) as procs:
        holders = _build(procs, cells)
        t0 = _kill(procs, 1)
        procs.restart(replay=True)
        holders.get.call().get(timeout=60)
        assert procs.run("total").values() == [1 + sum(range(cells))] * n
        return time.perf_counter() - t0


def _trials(fn: Callable[[], float], trials: int) -> list[float]:
    return [fn() for _ in range(trials)]


def run(quick: bool = False, procs: int = 4, cells: int = 20) -> list[tuple[str, list[float]]]:
    trials = 3 if quick else 7
    return [
        (
            f"fresh spawn_procs({procs}) + first reply (floor)",
            _trials(lambda: _fresh(procs), trials),
        ),
        (
            "kill -> survivors answer via healthy()",
            _trials(lambda: _survivors(procs, cells), trials),
        ),
        (
            "kill -> restart(ranks=[1]) -> every rank answers",
            _trials(lambda: _one_rank(procs, cells), trials),
        ),
        (
            f"kill -> restart(replay=True) of {cells} cells + push + spawn -> every rank answers",
            _trials(lambda: _replay_all(procs, cells), trials),
        ),
    ]


def table(rows: list[tuple[str, list[float]]]) -> str:
    floor = statistics.median(rows[0][1])
    lines = [
        "| from a rank's SIGKILL to ... | median ms | min | max | vs fresh spawn |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, values in rows:
        median = statistics.median(values)
        lines.append(
            f"| {label} | {median * 1e3:.0f} | {min(values) * 1e3:.0f} | "
            f"{max(values) * 1e3:.0f} | {median / floor:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 trials instead of 7")
    parser.add_argument("--procs", type=int, default=4, help="ranks per mesh (default 4)")
    parser.add_argument("--cells", type=int, default=20, help="cells in the history (default 20)")
    args = parser.parse_args(argv)
    print(table(run(quick=args.quick, procs=args.procs, cells=args.cells)))


if __name__ == "__main__":
    main()
