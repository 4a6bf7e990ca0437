"""What one more rank adds to a cast: ``call()`` gathered from 1, 2, 4 and 8 processes.

Run: ``python benchmarks/bench_cast.py`` (``--rounds N``, default 5).

Each round times ``call().get()`` on meshes of 1, 2, 4 and 8 worker processes
(one no-op actor each; workers import no torch) and, in the same round, the
floor: a raw pyzmq scatter/gather of one message to as many bare ``python``
echo processes over the same transport (a Unix socket in a private
directory). The cost of one more rank is the slope of a least-squares line
through the four medians; printed per round with its ratio, then the median
of the rounds.

Beside it, the CPU one more rank costs (controller and ranks, all threads, per
cast; the same slope) on each side. On two cores a cast to eight ranks keeps
both busy, so the time per extra rank follows the CPU per extra rank, while
the floor's small meshes, bound by wake-up latency more than by CPU, move its
slope by a third from round to round; the CPU figures move far less.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from collections.abc import Callable

from bench_scale import Tiny  # registers itself to go by value
from raw_echo import RawEcho, median_time

from monarch_nb import this_host

SIZES = (1, 2, 4, 8)
REPEAT = 400


def slope(xs: tuple[int, ...], ys: list[float]) -> float:
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    num = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    return num / sum((x - mean_x) ** 2 for x in xs)


def cpu_seconds(pids: list[int]) -> float:
    """CPU time the processes ``pids`` have used, all threads: from each thread's
    ``schedstat`` (nanoseconds) where Linux has it, else psutil (clock ticks)."""
    total = 0.0
    for pid in pids:
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0]) / 1e9
        except OSError:
            import psutil

            total += sum(psutil.Process(pid).cpu_times()[:2])
    return total


def timed(fn: Callable[[], object], pids: list[int]) -> tuple[float, float]:
    """``fn``'s median time, and the CPU ``pids`` used per run of it (warm-up runs
    included: they are the same work)."""
    warmup = 20
    before = cpu_seconds(pids)
    median = median_time(fn, REPEAT, warmup)
    return median, (cpu_seconds(pids) - before) / (REPEAT + warmup)


Series = tuple[list[float], list[float]]  # median times, CPU per run


def one_round() -> tuple[Series, Series]:
    ours: Series = ([], [])
    raw: Series = ([], [])
    mesh = this_host().spawn_procs(per_host={"procs": max(SIZES)}, name="cast", echo_output=False)
    try:
        pids = [os.getpid(), *mesh.pids]
        for size in SIZES:
            actors = mesh.slice(procs=slice(0, size)).spawn(f"tiny{size}", Tiny)
            for series, figure in zip(
                ours, timed(lambda a=actors: a.ping.call().get(timeout=60), pids), strict=True
            ):
                series.append(figure)
    finally:
        mesh.stop()
    with tempfile.TemporaryDirectory(prefix="monarch_nb-bench-") as ipc_dir:
        for size in SIZES:
            gather = RawEcho(f"ipc://{ipc_dir}/gather", peers=size)
            try:
                pids = [os.getpid(), *(child.pid for child in gather.children)]
                for series, figure in zip(
                    raw, timed(lambda g=gather: g.gather(1), pids), strict=True
                ):
                    series.append(figure)
            finally:
                gather.close()
    return ours, raw


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    print(
        "| round | call() to 1 / 2 / 4 / 8 procs | raw scatter/gather to 1 / 2 / 4 / 8 "
        "| per extra rank | raw per extra rank | ratio "
        "| CPU per extra rank | raw's | CPU ratio |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    columns: list[list[float]] = [[] for _ in range(6)]
    for i in range(args.rounds):
        (ours, ours_cpu), (raw, raw_cpu) = one_round()
        a, b = slope(SIZES, ours), slope(SIZES, raw)
        cpu_a, cpu_b = slope(SIZES, ours_cpu), slope(SIZES, raw_cpu)
        for column, figure in zip(columns, (a, b, a / b, cpu_a, cpu_b, cpu_a / cpu_b), strict=True):
            column.append(figure)
        print(
            f"| {i + 1} | {' / '.join(f'{t * 1e6:.0f}' for t in ours)} us "
            f"| {' / '.join(f'{t * 1e6:.0f}' for t in raw)} us "
            f"| {a * 1e6:.1f} us | {b * 1e6:.1f} us | {a / b:.2f}x "
            f"| {cpu_a * 1e6:.1f} us | {cpu_b * 1e6:.1f} us | {cpu_a / cpu_b:.2f}x |",
            flush=True,
        )
    a, b, ratio, cpu_a, cpu_b, cpu_ratio = map(statistics.median, columns)
    print(
        f"| median | | | {a * 1e6:.1f} us | {b * 1e6:.1f} us | {ratio:.2f}x "
        f"| {cpu_a * 1e6:.1f} us | {cpu_b * 1e6:.1f} us | {cpu_ratio:.2f}x |"
    )


if __name__ == "__main__":
    main()
