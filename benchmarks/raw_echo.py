"""The floor most benchmarks measure beside their figures: raw pyzmq echo peers
in other processes (no monarch_nb in them), and the median of repeated timings.

Imported by the ``bench_*`` scripts (benchmarks/ is their ``sys.path[0]``).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

import zmq

# One echo peer: a DEALER that says "ready", then sends back whatever comes, until
# "stop" (or until the benchmark that started it is gone).
ECHO_SERVER = """
import os, sys, zmq
parent = os.getppid()
ctx = zmq.Context()
s = ctx.socket(zmq.DEALER)
s.setsockopt(zmq.SNDHWM, 0)
s.setsockopt(zmq.RCVHWM, 0)
s.connect(sys.argv[1])
s.send(b"ready")
while True:
    if not s.poll(1000):
        if os.getppid() != parent:  # the benchmark died: do not outlive it
            break
        continue
    frames = s.recv_multipart(copy=False)
    if frames[0].bytes == b"stop":
        break
    s.send_multipart(frames, copy=False)
"""


def median_time(fn: Callable[[], object], repeat: int, warmup: int = 20) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


class RawEcho:
    """``peers`` raw pyzmq echo processes behind one ROUTER bound at ``address``
    (``tcp://HOST`` takes a free port); by default a Unix socket in a private
    directory, the transport a local mesh uses."""

    def __init__(self, address: str | None = None, peers: int = 1) -> None:
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        # Unbounded queues, like monarch_nb's own sockets: a ROUTER past its
        # high-water mark drops messages, which would hang a pipelined row.
        self.router.setsockopt(zmq.SNDHWM, 0)
        self.router.setsockopt(zmq.RCVHWM, 0)
        self.dir: str | None = None
        if address is None:
            self.dir = tempfile.mkdtemp(prefix="monarch_nb-bench-")
            address = f"ipc://{os.path.join(self.dir, 'echo')}"
        if address.startswith("tcp://"):
            address = f"{address}:{self.router.bind_to_random_port(address)}"
        else:
            self.router.bind(address)
        self.children = [
            subprocess.Popen([sys.executable, "-c", ECHO_SERVER, address]) for _ in range(peers)
        ]
        self.peers = [self.router.recv_multipart()[0] for _ in range(peers)]
        self.proc, self.peer = self.children[0], self.peers[0]

    def round_trip(self, frames: Sequence[bytes] = (b"x",)) -> None:
        """``frames`` to the first peer and back."""
        self.router.send_multipart([self.peer, *frames], copy=False)
        self.router.recv_multipart(copy=False)

    def pipelined(self, n: int) -> None:
        """``n`` messages to the first peer, then their ``n`` echoes."""
        for _ in range(n):
            self.router.send_multipart([self.peer, b"x"], copy=False)
        for _ in range(n):
            self.router.recv_multipart(copy=False)

    def gather(self, per_peer: int) -> None:
        """``per_peer`` messages to every peer, then all their echoes."""
        send = self.router.send_multipart
        for _ in range(per_peer):
            for peer in self.peers:
                send([peer, b"x"])
        for _ in range(per_peer * len(self.peers)):
            self.router.recv_multipart(copy=False)

    def close(self) -> None:
        for peer in self.peers:
            self.router.send_multipart([peer, b"stop"])
        for child in self.children:
            child.wait(30)
        self.router.close(0)
        self.ctx.term()
        if self.dir is not None:
            for name in os.listdir(self.dir):
                os.unlink(os.path.join(self.dir, name))
            os.rmdir(self.dir)
