"""The front page's figures, from one run: ``python benchmarks/headline.py [--write]``.

Measures the few figures that matter most to a user, each beside its floor
measured in the same run, and prints one markdown table. With ``--write`` it
also replaces the generated tables in README.md (the first rows) and in
docs/benchmarks.md (every row), stamped with the date and this command, so the
two pages never disagree and never mix figures from different days.

It reuses the area benchmarks (bench_runtime, bench_cast, bench_native,
bench_recovery, bench_scale): each row names the one whose own table has the
details. About four minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

ROOT = Path(__file__).resolve().parent.parent
COMMAND = "python benchmarks/headline.py --write"
# How many of the rows (in order) the README shows; docs/benchmarks.md shows all.
README_ROWS = 5
_BLOCK = re.compile(
    r"(<!-- headline figures: begin.*?-->\n).*?(<!-- headline figures: end -->)", re.S
)


@dataclass
class Headline:
    what: str
    ours: str
    floor: str
    ratio: str
    details: str  # the area benchmark with the full table


def _runtime_rows() -> list[Headline]:
    import bench_runtime

    rows = {row.what: row for row in bench_runtime.run(quick=False)}
    trip = rows["no-op call_one round trip"]
    piped = rows["pipelined call_one"]
    # On a mesh of its own, as `bench_runtime.py --echo` measures it: after the
    # run above's 10,000 pipelined calls the echo pays for their garbage.
    echo = {row.what: row for row in bench_runtime.echo_only(quick=False)}[
        "64 MiB tensor argument echo"
    ]
    start = rows["4-process mesh to first reply"]
    where = "`bench_runtime.py`"
    return [
        Headline(
            "no-op `call_one` round trip (median)",
            f"{trip.ours * 1e6:.0f} us",
            f"{trip.floor * 1e6:.0f} us (raw pyzmq round trip)",
            f"{trip.ratio:.2f}x",
            where,
        ),
        Headline(
            "pipelined `call_one`: 10,000 futures, then every `get()`",
            f"{piped.ours:,.0f} calls/s",
            f"{piped.floor:,.0f} messages/s (raw pyzmq pipelined)",
            f"{piped.ratio:.0%}",
            where,
        ),
        Headline(
            "a 64 MiB torch tensor as an argument, echoed back",
            f"{echo.ours:,.0f} MB/s",
            f"{echo.floor:,.0f} MB/s (raw pyzmq frames, alternating rounds)",
            f"{echo.ratio:.0%}",
            where,
        ),
        Headline(
            "4-process mesh, from start to first reply",
            f"{start.ours:.3f} s",
            f"{start.floor:.3f} s (4 bare `python -c 'import zmq'`)",
            f"{start.ratio:.2f}x",
            where,
        ),
    ]


def _cast_row(rounds: int = 3) -> Headline:
    import bench_cast

    ours, raw = [], []
    for _ in range(rounds):
        (times, _cpu), (raw_times, _raw_cpu) = bench_cast.one_round()
        ours.append(bench_cast.slope(bench_cast.SIZES, times))
        raw.append(bench_cast.slope(bench_cast.SIZES, raw_times))
    a, b = statistics.median(ours), statistics.median(raw)
    return Headline(
        "what one more rank adds to a cast (`call()` to 1, 2, 4, 8 processes)",
        f"{a * 1e6:.1f} us",
        f"{b * 1e6:.1f} us (raw pyzmq scatter/gather to bare processes)",
        f"{a / b:.2f}x",
        "`bench_cast.py`",
    )


def _scale_row() -> Headline:
    import bench_scale

    row = bench_scale.measure_one(128, 8, repeat=30)
    return Headline(
        "cast and gather from 1,024 ranks (128 processes x 8 actors)",
        f"{row.gather_s * 1e3:.2f} ms",
        f"{row.floor_s * 1e3:.2f} ms (raw pyzmq scatter/gather to 128 bare processes)",
        f"{row.gather_s / row.floor_s:.2f}x",
        "`bench_scale.py`",
    )


def _native_row() -> Headline:
    import bench_native

    rows: list[dict] = []
    bench_native.run(rows, quick=True)
    read = next(
        r
        for r in rows
        if r["benchmark"] == "same-host read (process_vm_readv)" and r["size"] == "64 MiB"
    )
    return Headline(
        "one-sided read of 64 MiB from another rank (`RDMABuffer`, same host)",
        f"{read['GB/s']:.2f} GB/s",
        f"{read['baseline GB/s']:.2f} GB/s (a memcpy in one process)",
        f"{read['GB/s'] / read['baseline GB/s']:.2f}x",
        "`bench_native.py`",
    )


def _recovery_row() -> Headline:
    import bench_recovery

    rows = dict(bench_recovery.run(quick=True))
    fresh = statistics.median(next(v for k, v in rows.items() if k.startswith("fresh")))
    one = statistics.median(rows["kill -> restart(ranks=[1]) -> every rank answers"])
    return Headline(
        "a rank SIGKILLed, `restart(ranks=[1])`, every rank answering again (4 ranks)",
        f"{one * 1e3:.0f} ms",
        f"{fresh * 1e3:.0f} ms (a fresh 4-process mesh to first reply)",
        f"{one / fresh:.2f}x",
        "`bench_recovery.py`",
    )


def measure() -> list[Headline]:
    # The README shows the first README_ROWS rows: the call path, then the cast.
    runtime = _runtime_rows()
    rows = [runtime[0], _cast_row(), runtime[1], _scale_row(), _native_row()]
    rows += [runtime[2], runtime[3], _recovery_row()]
    return rows


def render(rows: list[Headline], stamp: str) -> str:
    lines = [
        stamp,
        "",
        "| what | monarch_nb | floor, same run | ratio | details |",
        "|---|---:|---:|---:|---|",
    ]
    lines += [f"| {r.what} | {r.ours} | {r.floor} | {r.ratio} | {r.details} |" for r in rows]
    return "\n".join(lines) + "\n"


def _machine() -> str:
    cores = os.cpu_count() or 0
    return f"{cores} cores, Python {sys.version_info.major}.{sys.version_info.minor}"


def write(rows: list[Headline], today: str) -> None:
    stamp = f"Measured {today} ({_machine()}), one run of `{COMMAND}`."
    for page, shown in (("README.md", rows[:README_ROWS]), ("docs/benchmarks.md", rows)):
        path = ROOT / page
        text = path.read_text()
        if not _BLOCK.search(text):
            raise SystemExit(f"{page} has no '<!-- headline figures: begin -->' block to replace")
        table = render(shown, stamp)
        path.write_text(_BLOCK.sub(lambda m, t=table: m.group(1) + t + m.group(2), text, count=1))
        print(f"wrote {len(shown)} rows into {page}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--write", action="store_true", help="replace the tables in README.md and docs/"
    )
    args = parser.parse_args(argv)
    today = datetime.date.today().isoformat()
    rows = measure()
    print(render(rows, f"Measured {today} ({_machine()}), one run."))
    if args.write:
        write(rows, today)


if __name__ == "__main__":
    main()
