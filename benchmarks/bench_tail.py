"""The latency tail of a no-op round trip under a competing CPU load.

Run: ``python benchmarks/bench_tail.py`` (``--calls N``, default 5000).

Two busy processes (``while True: pass``) run beside the whole measurement on
this machine's cores; the no-op ``call_one`` round trip and a raw pyzmq round
trip over the same transport (a Unix socket in a private directory) are
sampled in alternating blocks of 100, so both see the same load. Prints the
median, p99 and p99.9 of each and their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_runtime import Noop, RawEcho

from monarch_nb import this_host

BLOCK = 100


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def sample(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    args = parser.parse_args(argv)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    raw = RawEcho()
    procs = this_host().spawn_procs(per_host={"procs": 1}, name="bench-tail")
    try:
        one = procs.spawn("one", Noop)
        ours: list[float] = []
        floor: list[float] = []
        sample(lambda: one.noop.call_one().get(), 200)  # warm up
        sample(lambda: raw.round_trip([b"x"]), 200)
        while len(ours) < args.calls:
            ours += sample(lambda: one.noop.call_one().get(), BLOCK)
            floor += sample(lambda: raw.round_trip([b"x"]), BLOCK)
    finally:
        procs.stop()
        raw.close()
        for p in busy:
            p.kill()
            p.wait()
    print("| no-op round trip, 2 busy processes beside it | monarch_nb | raw pyzmq | ratio |")
    print("|---|---:|---:|---:|")
    for name, q in (("median", 0.5), ("p99", 0.99), ("p99.9", 0.999)):
        a, b = percentile(ours, q) * 1e6, percentile(floor, q) * 1e6
        print(f"| {name} | {a:,.0f} us | {b:,.0f} us | {a / b:.2f}x |")
    print(f"\n({len(ours)} calls each; mean {statistics.fmean(ours) * 1e6:,.0f} us ours)")


if __name__ == "__main__":
    main()
