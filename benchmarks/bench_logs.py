"""What rank log files cost a rank that prints a lot: a print() flood with and without them.

Run: ``python benchmarks/bench_logs.py`` (``--lines N``, default 1,000,000;
``--repeats R``, default 3).

Two one-rank meshes start in the same run: the baseline with
``MONARCH_NB_LOG_FILES=0`` (its output goes only to the controller, as
before log files), the other writing its rank file (with rotation at the
default 10 MiB). Each runs the same cell, ``print(f"step {i} loss ...")`` N
times, timed on the rank: the time includes the pipe to the controller
(whose I/O thread reads every line), so the ratio is the cost a user sees.
Rounds alternate between the two meshes; the best round of each is kept.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from monarch_nb import this_host

FLOOD = (
    "import time\n"
    "t0 = time.perf_counter()\n"
    "for i in range({lines}):\n"
    "    print(f'step {{i}} loss {{i * 0.001:.4f}}')\n"
    "time.perf_counter() - t0"
)


def run(lines: int, repeats: int) -> dict[str, float]:
    """Best seconds for the flood without files (``baseline``) and with them (``files``)."""
    with tempfile.TemporaryDirectory(prefix="bench_logs_") as root:
        env = {"MONARCH_NB_LOG_DIR": root}
        meshes = {
            "baseline": this_host().spawn_procs(
                per_host={"procs": 1},
                name="bench-baseline",
                echo_output=False,
                env={**env, "MONARCH_NB_LOG_FILES": "0"},
            ),
            "files": this_host().spawn_procs(
                per_host={"procs": 1}, name="bench-files", echo_output=False, env=env
            ),
        }
        best = {name: float("inf") for name in meshes}
        try:
            for _ in range(repeats):
                for name, procs in meshes.items():
                    seconds = procs.exec(FLOOD.format(lines=lines)).get(timeout=600)[0]
                    best[name] = min(best[name], seconds)
        finally:
            for procs in meshes.values():
                procs.stop()
        kept = sum(
            os.path.getsize(os.path.join(folder, f))
            for folder, _, files in os.walk(root)
            for f in files
        )
    return {**best, "kept_mib": kept / (1 << 20)}


def table(result: dict[str, float], lines: int) -> str:
    base, files = result["baseline"], result["files"]
    return "\n".join(
        [
            "| what | seconds | lines/s | ratio |",
            "|---|---:|---:|---:|",
            f"| {lines:,} prints, no log file (baseline) | {base:.2f} | {lines / base:,.0f} "
            "| 1.00 |",
            f"| {lines:,} prints, rank log file | {files:.2f} | {lines / files:,.0f} "
            f"| {files / base:.2f} |",
            "",
            f"log files kept after rotation: {result['kept_mib']:.1f} MiB",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000, help="lines per flood")
    parser.add_argument("--repeats", type=int, default=3, help="rounds; the best is kept")
    args = parser.parse_args(argv)
    print(table(run(args.lines, args.repeats), args.lines))


if __name__ == "__main__":
    main()
