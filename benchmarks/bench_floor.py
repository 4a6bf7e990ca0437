"""What the control path's floor is made of: raw pyzmq against a plain Unix socket.

Run: ``python benchmarks/bench_floor.py`` (``--rounds N``, default 4).

The ratio targets of the control path (the no-op round trip, pipelined calls,
one more rank in a cast) divide monarch_nb's figures by a raw pyzmq
DEALER/ROUTER pair on the transport a local mesh uses (``ipc://``). That pair
is not the wire's floor: libzmq hands every message to its own I/O thread on
the way out and takes it from one on the way in, each hand-off a wake-up
through an eventfd. This benchmark measures the same echo with no libzmq at
all, two Python processes on a plain Unix stream socket (a one-byte message,
blocking ``sendall``/``recv``), in the same rounds, alternating, so the next
step for the transport can be chosen on figures: how much of the floor, and
of each call, is libzmq's threads rather than Python's work.

Rows: the round trip (median) and this side's CPU per round trip (all of its
threads: libzmq's I/O thread included); pipelined small messages per second
(pyzmq: all sent, then all received, as ``bench_runtime.py``; the Unix socket:
in windows of 200, since a stream socket's buffer holds only a few hundred
one-byte writes before both sides block in ``sendall``).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from bench_runtime import RawEcho

_UNIX_ECHO = """
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
while True:
    data = s.recv(1 << 20)
    if not data:
        break  # the benchmark closed its end (or died): do not outlive it
    s.sendall(data)
"""
_WINDOW = 200  # pipelined one-byte messages in flight on the Unix socket


class UnixEcho:
    """An echo peer on a plain Unix stream socket in a private directory."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="monarch_nb-floor-")
        path = os.path.join(self.dir, "echo")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)
        self.proc = subprocess.Popen([sys.executable, "-c", _UNIX_ECHO, path])
        listener.settimeout(60)
        try:
            self.sock, _ = listener.accept()
        except BaseException:
            self.proc.kill()  # no echo process left behind
            self.proc.wait()
            raise
        finally:
            listener.close()
            os.unlink(path)
        self.sock.settimeout(None)

    def round_trip(self) -> None:
        self.sock.sendall(b"x")
        self.sock.recv(1 << 16)

    def pipelined(self, n: int) -> None:
        for _ in range(n // _WINDOW):
            for _ in range(_WINDOW):
                self.sock.sendall(b"x")
            got = 0
            while got < _WINDOW:
                got += len(self.sock.recv(1 << 16))

    def close(self) -> None:
        self.sock.close()
        self.proc.wait(10)
        os.rmdir(self.dir)


def _per_call(fn: Callable[[], object], n: int) -> tuple[float, float]:
    """Median seconds per call of ``fn`` over ``n`` calls, and this process's CPU
    seconds per call (every thread)."""
    for _ in range(n // 20):
        fn()
    times = []
    cpu0 = time.process_time()
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), (time.process_time() - cpu0) / n


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    zmq_echo, unix_echo = RawEcho(), UnixEcho()
    rows: dict[str, list[tuple[float, float]]] = {}
    try:
        peers: dict[str, tuple[Callable[[], object], Callable[[int], object]]] = {
            "pyzmq": (lambda: zmq_echo.round_trip([b"x"]), zmq_echo.pipelined),
            "unix": (unix_echo.round_trip, unix_echo.pipelined),
        }
        n = 20_000
        for _ in range(args.rounds):
            for name, (round_trip, pipelined) in peers.items():
                seconds, cpu = _per_call(round_trip, 3000)
                rows.setdefault(f"{name} round trip", []).append((seconds * 1e6, cpu * 1e6))
                t0 = time.perf_counter()
                pipelined(n)
                rows.setdefault(f"{name} pipelined", []).append((n / (time.perf_counter() - t0), 0))
    finally:
        zmq_echo.close()
        unix_echo.close()

    def median(key: str, i: int = 0) -> float:
        return statistics.median(v[i] for v in rows[key])

    print(f"medians of {args.rounds} alternating rounds\n")
    print("| what | raw pyzmq (`ipc://`) | plain Unix socket | pyzmq / Unix |")
    print("|---|---:|---:|---:|")
    zr, ur = median("pyzmq round trip"), median("unix round trip")
    print(f"| round trip | {zr:.0f} us | {ur:.0f} us | {zr / ur:.1f}x |")
    zc, uc = median("pyzmq round trip", 1), median("unix round trip", 1)
    print(f"| this side's CPU per round trip | {zc:.0f} us | {uc:.0f} us | {zc / uc:.1f}x |")
    zp, up = median("pyzmq pipelined"), median("unix pipelined")
    print(f"| pipelined one-byte messages | {zp:,.0f}/s | {up:,.0f}/s | {zp / up:.2f}x |")


if __name__ == "__main__":
    main()
