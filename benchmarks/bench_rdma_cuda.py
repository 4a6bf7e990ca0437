"""RDMABuffer over CUDA memory beside torch's own copies, in the same run (needs a GPU).

The owner is a spawned process holding CUDA tensors, as a rank does; this
process reads them:

* ``local`` (CUDA IPC) into this process's GPU memory vs ``dst.copy_(src)``
  device to device inside one process;
* ``local`` into page-locked host memory vs ``pinned.copy_(src)`` in one
  process (device to host);
* ``tcp`` (the owner stages through page-locked memory and streams over
  loopback, as for a reader on another host) vs the same device-to-host copy.

Run ``python benchmarks/bench_rdma_cuda.py [--quick]``; each figure is the
median of several reads into memory already touched.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from bench_native import _row, format_table

from monarch_nb.native import RDMABuffer

MiB = 1 << 20
SIZES = {"1 MiB": MiB, "64 MiB": 64 * MiB, "1 GiB": 1024 * MiB}
REPEATS = {MiB: 100, 64 * MiB: 20, 1024 * MiB: 5}


def _owner(conn: Any, sizes: list[int]) -> None:
    tensors = {n: torch.full((n,), 7, dtype=torch.uint8, device="cuda") for n in sizes}
    conn.send({n: RDMABuffer(t) for n, t in tensors.items()})
    conn.recv()


def _median(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm up: connections, mappings, page-locked buffers
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(quick: bool = False) -> list[dict[str, Any]]:
    sizes = {k: v for k, v in SIZES.items() if not (quick and v > 64 * MiB)}
    torch.cuda.init()
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    owner = ctx.Process(target=_owner, args=(child, list(sizes.values())), daemon=True)
    owner.start()
    buffers = conn.recv()
    rows: list[dict[str, Any]] = []
    try:
        for label, n in sizes.items():
            rows.extend(_rows_for(label, n, buffers[n]))
    finally:
        conn.send("done")
        owner.join(30)
    return rows


def _rows_for(label: str, n: int, buf: RDMABuffer) -> list[dict[str, Any]]:
    reps = REPEATS[n]
    source = torch.full((n,), 7, dtype=torch.uint8, device="cuda")
    device = torch.empty(n, dtype=torch.uint8, device="cuda")
    pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    d2d = _median(lambda: device.copy_(source), reps)
    d2h = _median(lambda: pinned.copy_(source), reps)
    cases = [
        ("local (CUDA IPC) -> GPU", lambda: buf.read_into(device).get(), "copy_ D2D", d2d),
        ("local (CUDA IPC) -> pinned host", lambda: buf.read_into(pinned).get(), "copy_ D2H", d2h),
        (
            "tcp (owner stages) -> pinned host",
            lambda: buf.read_into(pinned, transport="tcp").get(),
            "copy_ D2H",
            d2h,
        ),
    ]
    rows = []
    for name, ours, base_name, base in cases:
        device.zero_()
        pinned.zero_()
        t = _median(ours, reps)
        landed = device if "GPU" in name else pinned
        assert int(landed[-1]) == 7, f"{name}: the bytes did not arrive"
        rows.append(_row(name, label, n, t, base_name, base))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the 1 GiB row")
    args = parser.parse_args()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(format_table(run(quick=args.quick)))


if __name__ == "__main__":
    main()
