"""Every benchmark, one command: ``python benchmarks/run.py [--quick]``.

Prints one markdown table per area; each figure stands beside a floor
measured in the same run (raw pyzmq, memcpy, raw sockets, a local cell).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _native(module: Any, quick: bool) -> str:
    rows: list[dict[str, Any]] = []
    module.run(rows, quick=quick)
    return module.format_table(rows)


def _notebook(module: Any, quick: bool) -> str:
    runs = 50 if quick else 200
    return module.render(module.measure(runs, 4), runs)


def _logs(module: Any, quick: bool) -> str:
    lines = 100_000 if quick else 1_000_000
    return module.table(module.run(lines, 3), lines)


def _rounds(quick_rounds: int, rounds: int) -> Callable[[Any, bool], None]:
    """A benchmark that prints its own table: its main, with ``--rounds``."""
    return lambda module, quick: module.main(["--rounds", str(quick_rounds if quick else rounds)])


def _table(module: Any, quick: bool) -> str:
    return module.table(module.run(quick=quick))


def _render(module: Any, quick: bool) -> str:
    return module.render(module.measure(quick=quick))


# area: (module, heading, what prints its table: the table's text, or None where
# the module printed it itself)
_AREAS: dict[str, tuple[str, str, Callable[[Any, bool], str | None]]] = {
    "runtime": ("bench_runtime", "Core runtime", _table),
    "floor": (
        "bench_floor",
        "What the control path's floor is made of (raw pyzmq, a plain Unix socket)",
        _rounds(2, 4),
    ),
    "actors": ("bench_actors", "Actors talking to actors", _table),
    "native": ("bench_native", "Native data plane", _native),
    "notebook": ("bench_notebook", "Notebook (%%mesh through a real kernel)", _notebook),
    "scale": ("bench_scale", "Scale (a call gathered from many ranks)", _render),
    "cast": ("bench_cast", "Cast (what one more rank adds)", _rounds(2, 5)),
    "chaos": ("bench_chaos", "Hardening (faults, load, bad input)", _render),
    "recovery": ("bench_recovery", "Recovery (a rank SIGKILLed, the mesh usable again)", _table),
    "multihost": (
        "bench_multihost",
        "Multi-host (network-namespace hosts through ssh)",
        lambda module, quick: module.main(["--quick"] if quick else []),
    ),
    "tensor": ("bench_tensor", "Tensor engine (mesh tensors driven from the controller)", _table),
    "logs": ("bench_logs", "Rank log files (a print() flood with and without them)", _logs),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, no 1 GiB rows")
    parser.add_argument(
        "--only",
        choices=list(_AREAS),
        action="append",
        help="run just these",
    )
    args = parser.parse_args(argv)
    wanted = args.only or list(_AREAS)
    for area, (name, heading, report) in _AREAS.items():
        if area not in wanted:
            continue
        module = importlib.import_module(name)
        print(f"## {heading}\n")
        text = report(module, args.quick)
        if text is None:
            print(flush=True)
        else:
            print(text, "\n", flush=True)


if __name__ == "__main__":
    main()
