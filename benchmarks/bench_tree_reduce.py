"""Replies folded on the way up against gathering every reply, many local agents.

Run: ``python benchmarks/bench_tree_reduce.py [--hosts 64] [--procs 2] [--fanout 8]``.

Every "host" is this machine ("ssh" runs the agent locally, as in
benchmarks/bench_tree.py): ``--hosts`` agents, ``--procs`` single-process
ranks each, no torch. One host mesh, its modes taken in turn in each round
(the baseline beside each figure, measured in the same run):

- **flat, call()**: no tree (``host_tree_fanout='0'``), every rank's reply read
  by the controller (what every gather did before);
- **tree, call()**: the cast down the tree, every rank's reply still read;
- **flat, reduced**: ``Accumulator(ep, 0, "sum")`` with no tree: each host's
  agent folds its own ranks, one fold per host;
- **tree, reduced**: the same down the tree: one fold per subtree root.

Figures: the controller process's CPU (all threads, libzmq's included, but
the handshake guard's: see below) per
call (a cast and its gather), and per gather (that less the CPU of a cast
alone, ``broadcast()``, measured in the same mode); the wall time per call.
The controller also spends CPU while idle, on every agent's and every rank's
heartbeat: with hundreds of them a second that is most of its CPU on this
loaded machine, whatever the calls do. So the heartbeats here come every
``--heartbeat`` seconds (5; the hosts' timeout 6 times that), and the idle
rate is printed beside the table (measured for 2 s each round). The handshake
guard's thread polls each connection not yet proven (``_wire._handshake_guard``)
every 10 ms; agents the controller seldom sends to (those below a subtree's
root) stay unproven, so it runs all along: its CPU is printed, not counted.
CPU times per thread come in clock ticks (10 ms): each mode's calls take
hundreds of ms of CPU, so that is a few percent.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

import cloudpickle
import psutil

from monarch_nb import Actor, config, endpoint, ssh_hosts
from monarch_nb.actor import Accumulator

cloudpickle.register_pickle_by_value(sys.modules[__name__])

_ME = psutil.Process()
LOCAL_SSH = (sys.executable, "-c", "import os,sys; os.execvp('sh', ['sh', '-c', sys.argv[2]])")


class One(Actor):
    @endpoint
    def one(self) -> int:
        return 1


_GUARD = "monarch_nb-handshake-guard"


def _cpu() -> float:
    """CPU seconds of every thread of this process (libzmq's too) but the handshake
    guard's, whose polling of unproven connections goes on whatever the calls do."""
    guards = {t.native_id for t in threading.enumerate() if t.name == _GUARD}
    return sum(t.user_time + t.system_time for t in _ME.threads() if t.id not in guards)


def _guard_cpu() -> float:
    guards = {t.native_id for t in threading.enumerate() if t.name == _GUARD}
    return sum(t.user_time + t.system_time for t in _ME.threads() if t.id in guards)


def _idle_rate() -> tuple[float, float]:
    """The controller's CPU seconds per second with nothing in flight: counted,
    and the handshake guard's (not counted)."""
    c0, g0, w0 = _cpu(), _guard_cpu(), time.perf_counter()
    time.sleep(2.0)
    elapsed = time.perf_counter() - w0
    return (_cpu() - c0) / elapsed, (_guard_cpu() - g0) / elapsed


def _measure(actors, calls: int, reduced: bool, ranks: int) -> dict[str, float]:
    """CPU (controller process) per call and per gather, and the wall time per call."""

    def once() -> None:
        if reduced:
            got = Accumulator(actors.one, 0, "sum").accumulate().get(timeout=120)
        else:
            got = sum(actors.one.call().get(timeout=120).values())
        assert got == ranks, got

    once()
    once()  # warm: plans made, links up
    idle = _idle_rate()
    c0 = _cpu()
    for _ in range(calls):
        actors.one.broadcast()
    actors.one.call().get(timeout=300)  # the casts done everywhere (one call more)
    cast = (_cpu() - c0) / (calls + 1)
    time.sleep(0.3)
    c0, w0 = _cpu(), time.perf_counter()
    for _ in range(calls):
        once()
    wall = (time.perf_counter() - w0) / calls
    call = (_cpu() - c0) / calls
    return {
        "call": call,
        "gather": max(0.0, call - cast),
        "wall": wall,
        "idle": idle[0],
        "guard": idle[1],
    }


MODES = (
    ("flat, call()", False, False),
    ("tree, call()", True, False),
    ("flat, reduced", False, True),
    ("tree, reduced", True, True),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--procs", type=int, default=2, help="ranks per host")
    parser.add_argument("--fanout", default="8")
    parser.add_argument("--calls", type=int, default=100, help="calls per mode per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--heartbeat", type=float, default=5.0, help="seconds between beats")
    args = parser.parse_args()
    started = time.perf_counter()
    settings = {"heartbeat": args.heartbeat, "host_timeout": 6 * args.heartbeat}
    with config.configured(host_tree_fanout=args.fanout, **settings):
        hosts = ssh_hosts([f"h{i}" for i in range(args.hosts)], ssh=LOCAL_SSH, bind="127.0.0.1")
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in MODES}
    try:
        tree = hosts._agents.tree
        roots = len(tree.roots or ())
        with config.configured(**settings):
            procs = hosts.spawn_procs({"procs": args.procs})
        actors = procs.spawn("one", One)
        ranks = len(procs.pids)
        actors.one.call().get(timeout=300)
        print(
            f"{args.hosts} agents x {args.procs} ranks up in {time.perf_counter() - started:.1f}"
            f" s; tree fan-out {args.fanout}: {roots} subtree roots, depth {tree.depth()}"
        )
        for _ in range(args.rounds):
            for name, in_tree, reduced in MODES:
                tree.set_fanout(args.fanout if in_tree else "0")
                runs[name].append(_measure(actors, args.calls, reduced, ranks))
        procs.stop()
    finally:
        hosts.shutdown()

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    replies = {
        "flat, call()": ranks,
        "tree, call()": ranks,
        "flat, reduced": args.hosts,
        "tree, reduced": roots,
    }
    print(
        f"\n{args.hosts} hosts x {args.procs} ranks ({ranks}), median of {args.rounds} rounds"
        f" of {args.calls} calls per mode (the ratio: each round's, then their median)"
    )
    print("| mode | messages to the controller per gather | controller CPU per gather |"
          " vs flat call() | per call (cast + gather) | wall per call |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|")

    def ratio(name: str) -> float:  # per round (its modes one after another), then the median
        pairs = zip(runs[name], runs["flat, call()"], strict=True)
        return statistics.median(r["gather"] / max(b["gather"], 1e-9) for r, b in pairs)

    for name, _, _ in MODES:
        gather, call = med(name, "gather"), med(name, "call")
        print(
            f"| {name} | {replies[name]} | {gather * 1e6:,.0f} us | {ratio(name):.2f}x |"
            f" {call * 1e6:,.0f} us | {med(name, 'wall') * 1e3:.1f} ms |"
        )
    idle = statistics.median(r["idle"] for rs in runs.values() for r in rs)
    guard = statistics.median(r["guard"] for rs in runs.values() for r in rs)
    print(
        f"\nthe controller idle: {idle * 1e3:.1f} ms of CPU per second (heartbeats every"
        f" {args.heartbeat:g} s), and its handshake guard's thread {guard * 1e3:.1f} ms per"
        " second (not counted above)"
    )


if __name__ == "__main__":
    threading.current_thread().name = "bench_tree_reduce"
    main()
