"""The per-call path, tree against tree: this checkout against another one, alternating.

Run: ``python benchmarks/bench_callpath.py --against PATH [--rounds 3]``, where
PATH is another checkout of monarch_nb (``git worktree add /tmp/before REV``,
with its native extension built or copied in). Without ``--against`` it
measures this checkout alone.

Each round starts a fresh process per tree (this checkout, then the other, in
turn, so a drift of the machine's speed hits both) that spawns 2 workers and
times, after a warm-up: 8,000 no-op ``call_one().get()`` one after another;
20,000 pipelined (4,000 futures, then every ``get()``, five times); 3,000
``call().get()`` to both workers. The same process times a raw pyzmq
round trip over the same transport (the floor). Printed: per-call times and
rates, each tree's median over the rounds, and the ratio to the floor; and
the CPU time one no-op call costs the caller's process and the worker's (all
their threads, libzmq's included), beside what one raw round trip costs the
two raw processes: on a busy or slow machine the wall times drift, the CPU
per call much less, and it is what is left to cut.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

NOOP_CALLS = 8_000
PIPELINE_BURST, PIPELINE_BURSTS = 4_000, 5
CASTS = 3_000
RAW_ROUND_TRIPS = 4_000


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds the processes ``pids`` have used, all threads."""
    import psutil

    return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)


def measure() -> dict[str, float]:
    """One tree's figures, in this process (a child of :func:`main`)."""
    import cloudpickle
    from bench_runtime import Noop, RawEcho

    from monarch_nb import this_host

    cloudpickle.register_pickle_by_value(sys.modules["bench_runtime"])
    raw = RawEcho()
    procs = this_host().spawn_procs(per_host={"procs": 2}, name="callpath")
    try:
        one = procs.slice(procs=0).spawn("one", Noop)
        both = procs.spawn("both", Noop)
        for _ in range(300):
            one.noop.call_one().get()
            both.noop.call().get()
            raw.round_trip([b"x"])

        raw_pids = [os.getpid(), raw.proc.pid]
        cpu0, t0 = _cpu_s(raw_pids), time.perf_counter()
        for _ in range(RAW_ROUND_TRIPS):
            raw.round_trip([b"x"])
        raw_s = (time.perf_counter() - t0) / RAW_ROUND_TRIPS
        raw_cpu_s = (_cpu_s(raw_pids) - cpu0) / RAW_ROUND_TRIPS

        pids = [os.getpid(), procs.pids[0]]
        cpu0, worker_cpu0, t0 = _cpu_s(pids[:1]), _cpu_s(pids[1:]), time.perf_counter()
        for _ in range(NOOP_CALLS):
            one.noop.call_one().get()
        noop_s = (time.perf_counter() - t0) / NOOP_CALLS
        caller_cpu_s = (_cpu_s(pids[:1]) - cpu0) / NOOP_CALLS
        worker_cpu_s = (_cpu_s(pids[1:]) - worker_cpu0) / NOOP_CALLS

        t0 = time.perf_counter()
        for _ in range(PIPELINE_BURSTS):
            futures = [one.noop.call_one() for _ in range(PIPELINE_BURST)]
            for future in futures:
                future.get()
        pipelined = PIPELINE_BURST * PIPELINE_BURSTS / (time.perf_counter() - t0)

        t0 = time.perf_counter()
        for _ in range(CASTS):
            both.noop.call().get()
        cast_s = (time.perf_counter() - t0) / CASTS
    finally:
        procs.stop()
        raw.close()
    return {
        "raw_s": raw_s,
        "noop_s": noop_s,
        "pipelined": pipelined,
        "cast_s": cast_s,
        "raw_cpu_s": raw_cpu_s,
        "caller_cpu_s": caller_cpu_s,
        "worker_cpu_s": worker_cpu_s,
    }


def run_tree(tree: str | None) -> dict[str, float]:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (tree, env.get("PYTHONPATH"))))
    out = subprocess.run(
        [sys.executable, __file__, "--child"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.abspath(__file__)),
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="another checkout of monarch_nb to compare with")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each tree (default 3)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure()))
        return
    trees = {"this checkout": None}
    if args.against:
        trees[args.against] = os.path.abspath(args.against)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, path in trees.items():
            runs[name].append(run_tree(path))
    print(
        "| tree | no-op call_one | raw round trip | ratio | pipelined calls/s "
        "| call() to 2 procs | CPU per no-op call: caller + worker | CPU per raw round trip "
        "|\n|---|---:|---:|---:|---:|---:|---:|---:|"
    )
    for name, figures in runs.items():

        def median(key: str, figures: list[dict[str, float]] = figures) -> float:
            return statistics.median(f[key] for f in figures)

        ratio = statistics.median(f["noop_s"] / f["raw_s"] for f in figures)
        print(
            f"| {name} | {median('noop_s') * 1e6:,.0f} us | {median('raw_s') * 1e6:,.0f} us "
            f"| {ratio:.2f}x | {median('pipelined'):,.0f} | {median('cast_s') * 1e6:,.0f} us "
            f"| {median('caller_cpu_s') * 1e6:,.0f} + {median('worker_cpu_s') * 1e6:,.0f} us "
            f"| {median('raw_cpu_s') * 1e6:,.0f} us |"
        )
    print(f"\n(medians of {args.rounds} runs of each tree, alternating)")


if __name__ == "__main__":
    main()
