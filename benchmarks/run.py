"""Every benchmark, one command: ``python benchmarks/run.py [--quick]``.

Prints one markdown table per area; each figure stands beside a floor
measured in the same run (raw pyzmq, memcpy, raw sockets, a local cell).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

_AREAS = [
    "runtime",
    "floor",
    "actors",
    "native",
    "notebook",
    "scale",
    "cast",
    "chaos",
    "recovery",
    "multihost",
    "tensor",
    "logs",
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, no 1 GiB rows")
    parser.add_argument(
        "--only",
        choices=_AREAS,
        action="append",
        help="run just these",
    )
    args = parser.parse_args(argv)
    wanted = args.only or _AREAS

    if "runtime" in wanted:
        runtime = importlib.import_module("bench_runtime")
        print("## Core runtime\n")
        print(runtime.table(runtime.run(quick=args.quick)), "\n", flush=True)
    if "floor" in wanted:
        floor = importlib.import_module("bench_floor")
        print("## What the control path's floor is made of (raw pyzmq, a plain Unix socket)\n")
        floor.main(["--rounds", "2" if args.quick else "4"])
        print(flush=True)
    if "actors" in wanted:
        actors = importlib.import_module("bench_actors")
        print("## Actors talking to actors\n")
        print(actors.table(actors.run(quick=args.quick)), "\n", flush=True)
    if "native" in wanted:
        native = importlib.import_module("bench_native")
        rows: list[dict[str, Any]] = []
        native.run(rows, quick=args.quick)
        print("## Native data plane\n")
        print(native.format_table(rows), "\n", flush=True)
    if "notebook" in wanted:
        notebook = importlib.import_module("bench_notebook")
        runs = 50 if args.quick else 200
        print("## Notebook (%%mesh through a real kernel)\n")
        print(notebook.render(notebook.measure(runs, 4), runs), "\n", flush=True)
    if "scale" in wanted:
        scale = importlib.import_module("bench_scale")
        print("## Scale (a call gathered from many ranks)\n")
        print(scale.render(scale.measure(quick=args.quick)), "\n", flush=True)
    if "cast" in wanted:
        cast = importlib.import_module("bench_cast")
        print("## Cast (what one more rank adds)\n")
        cast.main(["--rounds", "2" if args.quick else "5"])
        print(flush=True)
    if "chaos" in wanted:
        chaos = importlib.import_module("bench_chaos")
        print("## Hardening (faults, load, bad input)\n")
        print(chaos.render(chaos.measure(quick=args.quick)), "\n", flush=True)
    if "recovery" in wanted:
        recovery = importlib.import_module("bench_recovery")
        print("## Recovery (a rank SIGKILLed, the mesh usable again)\n")
        print(recovery.table(recovery.run(quick=args.quick)), "\n", flush=True)
    if "multihost" in wanted:
        multihost = importlib.import_module("bench_multihost")
        print("## Multi-host (network-namespace hosts through ssh)\n")
        multihost.main(["--quick"] if args.quick else [])
        print(flush=True)
    if "tensor" in wanted:
        tensor = importlib.import_module("bench_tensor")
        print("## Tensor engine (mesh tensors driven from the controller)\n")
        print(tensor.table(tensor.run(quick=args.quick)), "\n", flush=True)
    if "logs" in wanted:
        logs = importlib.import_module("bench_logs")
        lines = 100_000 if args.quick else 1_000_000
        print("## Rank log files (a print() flood with and without them)\n")
        print(logs.table(logs.run(lines, 3), lines), "\n", flush=True)


if __name__ == "__main__":
    main()
