"""The latency tail of a no-op round trip under a competing CPU load.

Run: ``python benchmarks/bench_tail.py`` (``--calls N``, default 5000), and
``--monarch-python PATH`` to add Monarch in the same run (PATH: an interpreter
with ``torchmonarch`` installed, e.g. a virtualenv's; see monarch_driver.py).

Two busy processes (``while True: pass``) run beside the whole measurement on
this machine's cores; the no-op ``call_one`` round trip, a raw pyzmq round
trip over the same transport (a Unix socket in a private directory) and, if
asked, Monarch's no-op ``call_one`` are sampled in alternating blocks of 100,
so all see the same load. Prints the median, p99 and p99.9 of each and the
ratios.
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


class MonarchDriver:
    """Monarch's no-op round trips, sampled in its own interpreter (monarch_driver.py)."""

    def __init__(self, python: str) -> None:
        driver = os.path.join(os.path.dirname(os.path.abspath(__file__)), "monarch_driver.py")
        self.proc = subprocess.Popen(
            [python, driver], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        if ready.strip() != "ready":
            raise RuntimeError(f"Monarch's driver did not start (it said {ready!r})")

    def sample(self, n: int) -> list[float]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(f"sample {n}\n")
        self.proc.stdin.flush()
        return [float(t) for t in self.proc.stdout.readline().split()]

    def close(self) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--monarch-python", help="an interpreter with torchmonarch installed")
    args = parser.parse_args(argv)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    raw = RawEcho()
    procs = this_host().spawn_procs(per_host={"procs": 1}, name="bench-tail")
    monarch = MonarchDriver(args.monarch_python) if args.monarch_python else None
    ours: list[float] = []
    floor: list[float] = []
    theirs: list[float] = []
    try:
        one = procs.spawn("one", Noop)
        sample(lambda: one.noop.call_one().get(), 200)  # warm up
        sample(lambda: raw.round_trip([b"x"]), 200)
        if monarch:
            monarch.sample(200)
        while len(ours) < args.calls:
            ours += sample(lambda: one.noop.call_one().get(), BLOCK)
            floor += sample(lambda: raw.round_trip([b"x"]), BLOCK)
            if monarch:
                theirs += monarch.sample(BLOCK)
    finally:
        if monarch:
            monarch.close()
        procs.stop()
        raw.close()
        for p in busy:
            p.kill()
            p.wait()
    columns = ["monarch_nb", "raw pyzmq", "ratio"] + (
        ["Monarch", "ours / Monarch"] if theirs else []
    )
    print("| no-op round trip, 2 busy processes beside it | " + " | ".join(columns) + " |")
    print("|---" + "|---:" * len(columns) + "|")
    for name, q in (("median", 0.5), ("p99", 0.99), ("p99.9", 0.999)):
        a, b = percentile(ours, q) * 1e6, percentile(floor, q) * 1e6
        cells = [f"{a:,.0f} us", f"{b:,.0f} us", f"{a / b:.2f}x"]
        if theirs:
            c = percentile(theirs, q) * 1e6
            cells += [f"{c:,.0f} us", f"{a / c:.2f}x"]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"\n({len(ours)} calls each; mean {statistics.fmean(ours) * 1e6:,.0f} us ours)")


if __name__ == "__main__":
    main()
