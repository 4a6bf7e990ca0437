"""Data-plane throughput beside its baselines, measured in the same run.

* same-host reads (cross-memory attach) vs a numpy copy of the same bytes
  inside one process (memcpy);
* the TCP transport on loopback vs a raw Python socket (``sendall`` in the
  owner, ``recv_into`` in the reader) moving the same bytes;
* the same TCP read sealed (AES-256-GCM, ``RDMABuffer(..., encrypt=True)``) vs
  plain: what encrypting the bulk stream costs;
* the same array sent the ordinary way, as an endpoint argument to an actor
  (signed pickle-5 frames over the control wire), vs the same-host read;
* a torch tensor a rank holds, returned inline as an ``RDMABuffer`` (as
  Monarch programs do) and read into a torch tensor here, vs one memcpy of
  the same number of bytes between two torch tensors inside this process.

The owner is a spawned process holding numpy arrays; the reader is this
process. Each figure is the median of several repetitions into a destination
whose pages are already touched.

Run ``python benchmarks/bench_native.py [--quick]`` for a markdown table, or
call ``run(rows)`` to collect the rows as dicts.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import multiprocessing as mp
import socket
import statistics
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import cloudpickle
import numpy as np

from monarch_nb import Actor, endpoint, this_host
from monarch_nb.native import RDMABuffer

# Workers cannot import benchmarks/: send the actor below by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MiB = 1 << 20
SIZES = {"1 MiB": MiB, "64 MiB": 64 * MiB, "1 GiB": 1024 * MiB}
REPEATS = {MiB: 200, 64 * MiB: 20, 1024 * MiB: 4}


def _owner(conn: Any, sizes: list[int]) -> None:
    arrays = {n: np.full(n, 7, dtype=np.uint8) for n in sizes}
    buffers = {n: RDMABuffer(a) for n, a in arrays.items()}
    listener = socket.create_server(("127.0.0.1", 0))

    def serve_raw() -> None:
        # The baseline: a plain Python socket sending the same bytes on request.
        while True:
            peer, _ = listener.accept()
            with peer:
                peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                while header := peer.recv(8):
                    (n,) = struct.unpack("<Q", header)
                    peer.sendall(memoryview(arrays[n]))

    threading.Thread(target=serve_raw, daemon=True).start()
    conn.send((buffers, listener.getsockname()[1]))
    conn.recv()  # until the reader is done


def _compare(
    ours: Callable[[], object], base: Callable[[], object], repeats: int
) -> tuple[float, float]:
    """Median seconds of ``ours`` and ``base``, interleaved so both see the same machine."""
    ours()  # warm up: connections, page tables
    base()
    a, b = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        ours()
        middle = time.perf_counter()
        base()
        a.append(middle - start)
        b.append(time.perf_counter() - middle)
    return statistics.median(a), statistics.median(b)


def _raw_reader(port: int) -> Callable[[np.ndarray], None]:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def read(dst: np.ndarray) -> None:
        view = memoryview(dst)
        sock.sendall(struct.pack("<Q", dst.nbytes))
        got = 0
        while got < dst.nbytes:
            n = sock.recv_into(view[got:])
            if n == 0:
                raise ConnectionError("raw baseline server closed")
            got += n

    return read


def run(rows: list[dict[str, Any]], *, quick: bool = False) -> None:
    """Measure and append one dict per (benchmark, size) to ``rows``."""
    sizes = {label: n for label, n in SIZES.items() if not (quick and n > 64 * MiB)}
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    owner = ctx.Process(target=_owner, args=(child, list(sizes.values())), daemon=True)
    owner.start()
    try:
        buffers, raw_port = parent.recv()
        raw_read = _raw_reader(raw_port)
        for label, n in sizes.items():
            rows.extend(_measure(buffers[n], label, n, raw_read))
        _endpoint_argument_rows(rows, buffers, {k: v for k, v in sizes.items() if v <= 64 * MiB})
        _torch_tensor_rows(rows, sizes)
    finally:
        parent.send("done")
        owner.join(10)
        if owner.is_alive():
            owner.kill()
            owner.join()


def _measure(
    buf: RDMABuffer, label: str, n: int, raw_read: Callable[[np.ndarray], None]
) -> list[dict[str, Any]]:
    repeats = REPEATS[n]
    dst = np.zeros(n, dtype=np.uint8)
    src = np.full(n, 7, dtype=np.uint8)
    local, memcpy = _compare(
        lambda: buf.read_into(dst, transport="local").get(),
        lambda: np.copyto(dst, src),
        repeats,
    )
    # As from another host: TCP, not the owner's Unix socket; then sealed as well.
    over_tcp = RDMABuffer._from_handle(dataclasses.replace(buf._handle, unix=None))
    sealed = RDMABuffer._from_handle(dataclasses.replace(buf._handle, unix=None, sealed=True))
    tcp, raw = _compare(
        lambda: over_tcp.read_into(dst, transport="tcp").get(),
        lambda: raw_read(dst),
        repeats,
    )
    sealed_tcp, plain_tcp = _compare(
        lambda: sealed.read_into(dst, transport="tcp").get(),
        lambda: over_tcp.read_into(dst, transport="tcp").get(),
        max(3, repeats // 2),
    )
    assert int(dst[-1]) == 7
    return [
        _row("same-host read (process_vm_readv)", label, n, local, "numpy copy", memcpy),
        _row("TCP transport read (loopback)", label, n, tcp, "raw socket", raw),
        _row("TCP read, sealed (AES-256-GCM)", label, n, sealed_tcp, "TCP read, plain", plain_tcp),
    ]


class _Sink(Actor):
    @endpoint
    def take(self, array: Any) -> int:
        return array.nbytes


def _endpoint_argument_rows(
    rows: list[dict[str, Any]], buffers: dict[int, RDMABuffer], sizes: dict[str, int]
) -> None:
    """The ordinary path, for contrast: the array as an endpoint argument."""
    with this_host().spawn_procs(per_host={"procs": 1}, name="bench-sink") as procs:
        sink = procs.spawn("sink", _Sink)
        for label, n in sizes.items():
            src = np.full(n, 7, dtype=np.uint8)
            dst = np.zeros(n, dtype=np.uint8)
            repeats = max(3, REPEATS[n] // 4)
            argument, rdma = _compare(
                lambda s=src: sink.take.call_one(s).get(),
                lambda d=dst, b=buffers[n]: b.read_into(d, transport="local").get(),
                repeats,
            )
            rows.append(
                _row(
                    "endpoint argument (signed frames)",
                    label,
                    n,
                    argument,
                    "same-host RDMA read",
                    rdma,
                )
            )


class _TensorOwner(Actor):
    """A rank holding torch tensors (allocated as ranks allocate them: on
    transparent huge pages unless the user set THP_MEM_ALLOC_ENABLE)."""

    def __init__(self, sizes: list[int]) -> None:
        import torch

        self.tensors = {n: torch.full((n,), 7, dtype=torch.uint8) for n in sizes}

    @endpoint
    def buffer(self, n: int) -> RDMABuffer:
        # Monarch's way: a buffer made inline and returned; the rank keeps the
        # registration until drop() or its exit.
        return RDMABuffer(self.tensors[n].view(-1))


def _torch_tensor_rows(rows: list[dict[str, Any]], sizes: dict[str, int]) -> None:
    """A rank's torch tensor read one-sidedly, against one memcpy of the same size."""
    import torch

    with this_host().spawn_procs(per_host={"procs": 1}, name="bench-torch-owner") as procs:
        owner = procs.spawn("owner", _TensorOwner, list(sizes.values()))
        for label, n in sizes.items():
            buf = owner.buffer.call_one(n).get(timeout=120)
            src = torch.full((n,), 7, dtype=torch.uint8)
            dst = torch.zeros(n, dtype=torch.uint8)
            # The floor is one memcpy of the same bytes (torch's own copy_ of a
            # large tensor runs on several threads: not a memcpy).
            read, copy = _compare(
                lambda b=buf, d=dst: b.read_into(d, transport="local").get(),
                lambda d=dst, s=src, n=n: ctypes.memmove(d.data_ptr(), s.data_ptr(), n),
                REPEATS[n],
            )
            assert int(dst[-1]) == 7
            rows.append(
                _row("same-host read of a rank's torch tensor", label, n, read, "memcpy", copy)
            )


def _row(name: str, label: str, n: int, ours: float, baseline: str, base: float) -> dict[str, Any]:
    return {
        "benchmark": name,
        "size": label,
        "GB/s": n / ours / 1e9,
        "baseline": baseline,
        "baseline GB/s": n / base / 1e9,
        "ratio": base / ours,
    }


def format_table(rows: list[dict[str, Any]]) -> str:
    """Render rows as a markdown table."""
    lines = [
        "| benchmark | size | GB/s | baseline | baseline GB/s | ratio |",
        "|---|---|---:|---|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['benchmark']} | {r['size']} | {r['GB/s']:.2f} | {r['baseline']} | "
            f"{r['baseline GB/s']:.2f} | {r['ratio']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the 1 GiB rows")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    run(rows, quick=args.quick)
    print(format_table(rows))


if __name__ == "__main__":
    main()
