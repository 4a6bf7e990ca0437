"""What the live dashboard costs the kernel, with many ranks, through a real kernel.

Run: ``python benchmarks/bench_dashboard.py`` (``--ranks N``, ``--seconds S``).

One kernel starts a mesh of N lightweight ranks (workers that never import
torch). Each window runs one cell for S seconds and measures, on the kernel's
side, the comm messages per second it emitted on iopub (widget updates, what
a browser would have to apply) and the CPU seconds per second its process
used (its I/O thread, the dashboard's thread, ipykernel). Windows:

- ``busy kernel``: the kernel's main thread sleeps in a local cell; ranks idle,
  heartbeating every second.
- ``progress bars``: every rank redraws a tqdm-style bar 4 times a second
  (N x 4 output events a second) while a ``%%mesh`` cell holds the kernel.

Each window is measured first without a dashboard (the baseline: the same
mesh, the same cell), then with one, and printed as a ratio. The dashboard
draws its history too: a CPU sparkline per tile and the chart of the 8
busiest ranks, refreshed each second from the telemetry the controller keeps
(the ranks have heartbeated for a while when the windows start).
"""

from __future__ import annotations

import argparse
import queue
import sys
import time
from dataclasses import dataclass

import psutil
from jupyter_client.manager import KernelManager

WINDOWS = {
    "busy kernel": "import time\ntime.sleep({seconds})",
    "progress bars": (
        "%%mesh\nimport sys, time\nfor i in range({ticks}):\n"
        "    sys.stderr.write(f'\\r{{i}}/{ticks} |'); sys.stderr.flush()\n"
        "    time.sleep(0.25)\n"
    ),
}


@dataclass(frozen=True)
class Row:
    window: str
    dashboard: bool
    comm_per_s: float
    comm_kib_per_s: float
    cpu_per_s: float  # kernel-process CPU seconds per wall second


class BenchKernel:
    def __init__(self) -> None:
        self.manager = KernelManager(kernel_name="python3")
        self.manager.start_kernel(extra_arguments=["--HistoryManager.enabled=False"])
        self.client = self.manager.blocking_client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)
        self.process = psutil.Process(self.manager.provisioner.process.pid)

    def run(self, code: str, timeout: float = 180) -> tuple[int, int, float, float]:
        """Run ``code``: (comm messages, their bytes, wall seconds, kernel CPU seconds)."""
        print(f"... {code.splitlines()[0]}", file=sys.stderr, flush=True)
        cpu0 = sum(self.process.cpu_times()[:2])
        start = time.perf_counter()
        msg_id = self.client.execute(code, store_history=False)
        comms = comm_bytes = 0
        reply = None
        idle = False
        deadline = time.monotonic() + timeout
        while not (idle and reply is not None):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{code!r} took more than {timeout} s")
            try:
                msg = self.client.get_iopub_msg(timeout=0.02)
            except queue.Empty:
                msg = None
            if msg is None or reply is None:  # the shell only when iopub is quiet
                try:
                    shell = self.client.get_shell_msg(timeout=0 if msg else 0.005)
                    if shell["parent_header"].get("msg_id") == msg_id:
                        reply = shell
                except queue.Empty:
                    pass
            if msg is None:
                continue
            if msg["msg_type"] == "comm_msg":
                comms += 1
                comm_bytes += len(str(msg["content"]))
            elif msg["msg_type"] == "status" and msg["parent_header"].get("msg_id") == msg_id:
                idle = msg["content"]["execution_state"] == "idle"
        wall = time.perf_counter() - start
        cpu = sum(self.process.cpu_times()[:2]) - cpu0
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"cell failed: {code!r}: {reply['content']}")
        return comms, comm_bytes, wall, cpu

    def shutdown(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=False)


def measure(ranks: int = 256, seconds: float = 5.0) -> list[Row]:
    kernel = BenchKernel()
    rows: list[Row] = []
    try:
        kernel.run("%load_ext monarch_nb")
        kernel.run(f"%mesh start --procs {ranks} --no-dashboard --force")
        kernel.run("%%mesh\n1")  # every rank up and answering
        for dashboard in (False, True):
            if dashboard:
                # Shown, and its chart made (bqplot imported) before a window starts.
                kernel.run(
                    "from monarch_nb import current_mesh\nd = current_mesh().dashboard()\n"
                    "display(d)\nassert d.wait_until(lambda d: d.chart is not None, 120)"
                )
            for window, template in WINDOWS.items():
                code = template.format(seconds=seconds, ticks=int(seconds * 4))
                comms, size, wall, cpu = kernel.run(code)
                rows.append(Row(window, dashboard, comms / wall, size / 1024 / wall, cpu / wall))
        kernel.run("%mesh stop")
    finally:
        kernel.shutdown()
    return rows


def render(rows: list[Row], ranks: int) -> str:
    lines = [
        f"Dashboard cost with {ranks} ranks (kernel side; baseline: same mesh, no dashboard)",
        "",
        "| window | comm msgs/s | comm KiB/s | kernel CPU s/s, no dashboard "
        "| with dashboard | ratio |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for window in WINDOWS:
        base = next(r for r in rows if r.window == window and not r.dashboard)
        dash = next(r for r in rows if r.window == window and r.dashboard)
        ratio = dash.cpu_per_s / base.cpu_per_s if base.cpu_per_s > 0 else float("nan")
        lines.append(
            f"| {window} | {dash.comm_per_s:.1f} (baseline {base.comm_per_s:.1f}) "
            f"| {dash.comm_kib_per_s:.1f} | {base.cpu_per_s:.3f} | {dash.cpu_per_s:.3f} "
            f"| {ratio:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args(argv)
    print(render(measure(args.ranks, args.seconds), args.ranks))


if __name__ == "__main__":
    main()
