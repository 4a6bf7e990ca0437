"""What ``%%mesh`` adds to a notebook cell, end to end through a real kernel.

Run: ``python benchmarks/bench_notebook.py`` (``--runs N``, ``--ranks N``).

Each figure is the time from sending an ``execute_request`` to receiving its
``execute_reply`` (what a notebook front end waits for), median over N runs.
The baseline is a plain local cell (``pass``) in the same kernel, measured
interleaved with the ``%%mesh`` cell so both see the same machine state.
For reference, ipyparallel's ``%px x=1`` on 4 engines takes about 10.5 ms.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import time
from dataclasses import dataclass

from jupyter_client.manager import KernelManager


@dataclass(frozen=True)
class Row:
    """One benchmark line: what ran, and the median / p90 reply time in ms."""

    cell: str
    median_ms: float
    p90_ms: float


def _round_trip(client, code: str) -> float:
    start = time.perf_counter()
    msg_id = client.execute(code, store_history=False)
    while True:
        reply = client.get_shell_msg(timeout=30)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    elapsed = time.perf_counter() - start
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"benchmark cell failed: {code!r}: {reply['content']}")
    while True:  # keep the iopub queue empty between runs
        try:
            client.get_iopub_msg(timeout=0)
        except queue.Empty:
            break
    return elapsed * 1000


def _summary(cell: str, samples: list[float]) -> Row:
    ordered = sorted(samples)
    return Row(cell, statistics.median(ordered), ordered[int(0.9 * (len(ordered) - 1))])


def measure(runs: int = 200, ranks: int = 4) -> list[Row]:
    """Rows: the plain cell, the ``%%mesh`` cell, and the difference of medians."""
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(extra_arguments=["--HistoryManager.enabled=False"])
    client = manager.blocking_client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        _round_trip(client, "%load_ext monarch_nb")
        _round_trip(client, f"%mesh start --procs {ranks}")
        local, mesh = [], []
        for _ in range(max(10, runs // 10)):  # warm up both paths
            _round_trip(client, "pass")
            _round_trip(client, "%%mesh\npass")
        for _ in range(runs):
            local.append(_round_trip(client, "pass"))
            mesh.append(_round_trip(client, "%%mesh\npass"))
        _round_trip(client, "%mesh stop")
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)
    plain_row = _summary("local cell: `pass`", local)
    mesh_row = _summary(f"`%%mesh` cell on {ranks} ranks: `pass`", mesh)
    added = Row(
        "added by `%%mesh` (difference of medians)",
        mesh_row.median_ms - plain_row.median_ms,
        mesh_row.p90_ms - plain_row.p90_ms,
    )
    return [plain_row, mesh_row, added]


def render(rows: list[Row], runs: int) -> str:
    lines = [
        f"| cell (execute_request -> execute_reply, {runs} runs) | median ms | p90 ms |",
        "|---|---:|---:|",
    ]
    lines += [f"| {r.cell} | {r.median_ms:.2f} | {r.p90_ms:.2f} |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--ranks", type=int, default=4)
    args = parser.parse_args()
    print(render(measure(args.runs, args.ranks), args.runs))


if __name__ == "__main__":
    main()
