"""The control path over a private Unix socket against TCP loopback, same run.

Run: ``python benchmarks/bench_transport.py`` (``--rounds N``, default 3).

Local workers reach the controller over an ``ipc://`` socket in the tree's
private 0700 run directory (the default since the hardening work: no other
user can connect at all); ``MONARCH_NB_BIND=127.0.0.1`` puts them back on a
TCP loopback port, as before it. Each round measures both, one after the
other, each in a fresh controller process; the table gives the medians over
the rounds and the ratio ipc / TCP. TCP links also hash every bulk byte (a
plain port cannot vouch for it), so the 1 MiB echo row shows both effects.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROWS = (
    ("no-op call_one round trip", "us"),
    ("call() gathered from 4 procs", "us"),
    ("pipelined call_one", "calls/s"),
    ("1 MiB bytes argument echo", "MB/s"),
)


def child() -> None:
    """One controller: measure each row and print them as JSON."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_runtime import Noop, median_time

    from monarch_nb import this_host

    procs = this_host().spawn_procs(per_host={"procs": 4}, name="bench-transport")
    try:
        one = procs.slice(procs=0).spawn("one", Noop)
        four = procs.spawn("four", Noop)
        n = 3000
        payload = bytes(1 << 20)

        def pipelined() -> None:
            for fut in [one.noop.call_one() for _ in range(n)]:
                fut.get()

        figures = {
            ROWS[0][0]: median_time(lambda: one.noop.call_one().get(), 1000) * 1e6,
            ROWS[1][0]: median_time(lambda: four.noop.call().get(), 1000) * 1e6,
            ROWS[2][0]: n / median_time(pipelined, 3, warmup=1),
            ROWS[3][0]: (1 << 20) / median_time(lambda: one.echo.call_one(payload).get(), 50) / 1e6,
        }
    finally:
        procs.stop()
    print(json.dumps(figures))


def measure(tcp: bool) -> dict[str, float]:
    env = dict(os.environ)
    env.pop("MONARCH_NB_BIND", None)
    if tcp:
        env["MONARCH_NB_BIND"] = "127.0.0.1"
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child()
        return
    runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    started = time.monotonic()
    for _ in range(args.rounds):
        for tcp in (True, False):
            runs[tcp].append(measure(tcp))
    print("| what | private Unix socket | TCP loopback (before) | ipc / TCP |")
    print("|---|---:|---:|---:|")
    for name, unit in ROWS:
        ipc = statistics.median(r[name] for r in runs[False])
        tcp = statistics.median(r[name] for r in runs[True])
        fmt = "{:,.0f}"
        print(
            f"| {name} | {fmt.format(ipc)} {unit} | {fmt.format(tcp)} {unit} | {ipc / tcp:.2f}x |"
        )
    print(f"\n({args.rounds} rounds, medians; {time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
