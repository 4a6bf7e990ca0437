"""What rank log files cost a rank that prints a lot: a print() flood with and without them.

Run: ``python benchmarks/bench_logs.py`` (``--lines N``, default 1,000,000;
``--repeats R``, default 3); ``--grep`` for the search row instead.

Two one-rank meshes start in the same run: the baseline with
``MONARCH_NB_LOG_FILES=0`` (its output goes only to the controller, as
before log files), the other writing its rank file (with rotation at the
default 10 MiB). Each runs the same cell, ``print(f"step {i} loss ...")`` N
times, timed on the rank: the time includes the pipe to the controller
(whose I/O thread reads every line), so the ratio is the cost a user sees.
Rounds alternate between the two meshes; the best round of each is kept.

``--grep`` (``--gib G``, default 1): 8 ranks write G GiB of log lines in all
(1 KiB lines, one in 100,000 holding ``needle``; no rotation), then
``procs.logs(grep="needle")`` is timed beside ``grep -h needle`` over the
same files, best of ``--repeats`` each, after one warm-up read of each (both
read from the page cache).
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time

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


GREP_RANKS = 8
WRITE = (
    "import os\n"
    "pad = 'x' * 1000\n"
    "for i in range({lines}):\n"
    "    print(f'step {{i:>9}} rank {{rank}} ', pad, 'needle' if i % 100_000 == 0 else '')\n"
)


def grep_run(gib: float, repeats: int) -> dict[str, float]:
    """Best seconds of ``logs(grep=)`` and of ``grep`` over the same files; sizes."""
    lines = int(gib * (1 << 30) / GREP_RANKS / 1024)
    with tempfile.TemporaryDirectory(prefix="bench_logs_grep_") as root:
        env = {"MONARCH_NB_LOG_DIR": root, "MONARCH_NB_LOG_MAX_BYTES": str(1 << 40)}
        procs = this_host().spawn_procs(
            per_host={"procs": GREP_RANKS}, name="bench-grep", echo_output=False, env=env
        )
        try:
            procs.exec(WRITE.format(lines=lines)).get(timeout=1800)
            files = sorted(glob.glob(os.path.join(root, "bench-grep", "*.log")))
            size = sum(os.path.getsize(f) for f in files)

            def ours() -> int:
                return len(procs.logs(grep="needle"))

            def theirs() -> int:
                out = subprocess.run(
                    ["grep", "-h", "needle", *files], capture_output=True, check=True
                ).stdout
                return out.count(b"\n")

            found = {"ours": ours(), "grep": theirs()}  # warm-up: the page cache
            best = {name: float("inf") for name in found}
            for _ in range(repeats):
                for name, read in (("ours", ours), ("grep", theirs)):
                    start = time.perf_counter()
                    read()
                    best[name] = min(best[name], time.perf_counter() - start)
        finally:
            procs.stop()
    return {
        **best,
        "gib": size / (1 << 30),
        "matches": found["ours"],
        "grep_matches": found["grep"],
    }


def grep_table(result: dict[str, float]) -> str:
    ours, grep = result["ours"], result["grep"]
    size = f"{result['gib']:.2f} GiB on {GREP_RANKS} ranks"
    return "\n".join(
        [
            "| what | seconds | GiB/s | ratio |",
            "|---|---:|---:|---:|",
            f"| grep -h needle over the files ({size}, baseline) | {grep:.2f} "
            f"| {result['gib'] / grep:.2f} | 1.00 |",
            f"| procs.logs(grep='needle') | {ours:.2f} | {result['gib'] / ours:.2f} "
            f"| {ours / grep:.2f} |",
            "",
            f"matches: {result['matches']:.0f} (grep: {result['grep_matches']:.0f})",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000, help="lines per flood")
    parser.add_argument("--repeats", type=int, default=3, help="rounds; the best is kept")
    parser.add_argument("--grep", action="store_true", help="time logs(grep=) against grep")
    parser.add_argument("--gib", type=float, default=1.0, help="log size for --grep")
    args = parser.parse_args(argv)
    if args.grep:
        print(grep_table(grep_run(args.gib, args.repeats)))
    else:
        print(table(run(args.lines, args.repeats), args.lines))


if __name__ == "__main__":
    main()
