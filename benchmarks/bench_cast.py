"""What one more rank adds to a cast: ``call()`` gathered from 1, 2, 4 and 8 processes.

Run: ``python benchmarks/bench_cast.py`` (``--rounds N``, default 5).

Each round times ``call().get()`` on meshes of 1, 2, 4 and 8 worker processes
(one no-op actor each; workers import no torch) and, in the same round, the
floor: a raw pyzmq scatter/gather of one message to as many bare ``python``
echo processes over the same transport (a Unix socket in a private
directory). The cost of one more rank is the slope of a least-squares line
through the four medians; printed per round with its ratio, then the median
of the rounds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

from bench_runtime import median_time
from bench_scale import RawGather, Tiny  # registers itself to go by value

from monarch_nb import this_host

SIZES = (1, 2, 4, 8)
REPEAT = 400


def slope(xs: tuple[int, ...], ys: list[float]) -> float:
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    num = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    return num / sum((x - mean_x) ** 2 for x in xs)


def one_round() -> tuple[list[float], list[float]]:
    ours, raw = [], []
    mesh = this_host().spawn_procs(per_host={"procs": max(SIZES)}, name="cast", echo_output=False)
    try:
        for size in SIZES:
            actors = mesh.slice(procs=slice(0, size)).spawn(f"tiny{size}", Tiny)
            ours.append(median_time(lambda a=actors: a.ping.call().get(timeout=60), REPEAT))
    finally:
        mesh.stop()
    with tempfile.TemporaryDirectory(prefix="monarch_nb-bench-") as ipc_dir:
        for size in SIZES:
            gather = RawGather(size, ipc_dir)
            try:
                raw.append(median_time(lambda g=gather: g.gather(1), REPEAT))
            finally:
                gather.close()
    return ours, raw


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    print(
        "| round | call() to 1 / 2 / 4 / 8 procs | raw scatter/gather to 1 / 2 / 4 / 8 "
        "| per extra rank | raw per extra rank | ratio |"
    )
    print("|---|---|---|---:|---:|---:|")
    ratios, per_rank, per_rank_raw = [], [], []
    for i in range(args.rounds):
        ours, raw = one_round()
        a, b = slope(SIZES, ours), slope(SIZES, raw)
        ratios.append(a / b)
        per_rank.append(a)
        per_rank_raw.append(b)
        print(
            f"| {i + 1} | {' / '.join(f'{t * 1e6:.0f}' for t in ours)} us "
            f"| {' / '.join(f'{t * 1e6:.0f}' for t in raw)} us "
            f"| {a * 1e6:.1f} us | {b * 1e6:.1f} us | {a / b:.2f}x |",
            flush=True,
        )
    print(
        f"| median | | | {statistics.median(per_rank) * 1e6:.1f} us "
        f"| {statistics.median(per_rank_raw) * 1e6:.1f} us | {statistics.median(ratios):.2f}x |"
    )


if __name__ == "__main__":
    main()
