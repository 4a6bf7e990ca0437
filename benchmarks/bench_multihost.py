"""Multi-host: cast + gather across hosts, and the one-sided read between hosts.

Run (root, Linux): ``python benchmarks/bench_multihost.py [--quick]``.

The hosts are network namespaces on this machine with their own sshd
(``tests/multihost/cluster.py``), reached through the real ssh launcher, so
every message crosses a veth pair and a bridge as it would cross a switch; the
2 cores are shared by everything, so this measures overheads, not a network.

- **cast + gather**: one endpoint call to every rank of ``H`` hosts x 4 ranks,
  all replies gathered (the controller sends one message per host; each agent
  relays to its 4 ranks). Floor: a raw pyzmq DEALER/ROUTER round trip between
  the controller and one echo process on host 0, over the same path.
- **one-sided read between hosts**: a rank on host 1 reads a 64 MiB tensor
  registered as an ``RDMABuffer`` by a rank on host 0 (the TCP transport).
  Floor: the same bytes sent over one plain TCP socket from host 0 to host 1
  with ``sendall``/``recv_into``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import cloudpickle

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "multihost"))
sys.path.insert(0, HERE)

from raw_echo import median_time  # noqa: E402

from monarch_nb import Actor, endpoint, ssh_hosts  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])

READ_BYTES = 64 << 20
RANKS_PER_HOST = 4

_ECHO = """
import sys, zmq
s = zmq.Context().socket(zmq.ROUTER)
port = s.bind_to_random_port("tcp://" + sys.argv[1])
print(port, flush=True)
while True:
    frames = s.recv_multipart()
    if frames[1] == b"stop":
        break
    s.send_multipart(frames)
"""

_SINK = """
import socket, sys, time
n = int(sys.argv[2])
srv = socket.socket()
srv.bind((sys.argv[1], 0))
srv.listen(1)
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
buf = bytearray(n)
view = memoryview(buf)
for _ in range(int(sys.argv[3])):
    got = 0
    while got < n:
        got += conn.recv_into(view[got:], n - got)
    conn.sendall(b"k")
"""

_SOURCE = """
import socket, sys, time
n, reps = int(sys.argv[3]), int(sys.argv[4])
data = bytearray(n)
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
times = []
for _ in range(reps):
    t = time.perf_counter()
    c.sendall(data)
    c.recv(1)
    times.append(time.perf_counter() - t)
print(min(times), flush=True)
"""


class Echo(Actor):
    @endpoint
    def ping(self) -> int:
        return 0


class Reader(Actor):
    def __init__(self) -> None:
        import torch

        self.data = torch.ones(READ_BYTES // 4)

    @endpoint
    def handle(self):
        from monarch_nb.native import RDMABuffer

        self.buffer = RDMABuffer(self.data)
        return self.buffer

    @endpoint
    def read(self, handle, reps: int) -> float:
        import torch

        dst = torch.empty(READ_BYTES // 4)
        best = float("inf")
        for _ in range(reps):
            t = time.perf_counter()
            handle.read_into(dst).get(timeout=60)
            best = min(best, time.perf_counter() - t)
        assert float(dst[0]) == 1.0
        return best


def raw_round_trip(cluster, n: int) -> float:
    argv = cluster.host_argv(0, [sys.executable, "-c", _ECHO, cluster.hosts[0]])
    return _raw_round_trip(argv, cluster.hosts[0], n)


def _raw_round_trip(argv: list[str], address: str, n: int) -> float:
    import zmq

    echo = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        port = int(echo.stdout.readline())
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.connect(f"tcp://{address}:{port}")

        def once() -> None:
            sock.send(b"x")
            sock.recv()

        result = median_time(once, n, warmup=20)
        sock.send(b"stop")
        sock.close(0)
        ctx.term()
        return result
    finally:
        echo.wait(10)


def raw_socket_transfer(cluster, reps: int) -> float:
    sink = subprocess.Popen(
        cluster.host_argv(
            1, [sys.executable, "-c", _SINK, cluster.hosts[1], str(READ_BYTES), str(reps)]
        ),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = sink.stdout.readline().strip()
        out = subprocess.run(
            cluster.host_argv(
                0,
                [
                    sys.executable,
                    "-c",
                    _SOURCE,
                    cluster.hosts[1],
                    port,
                    str(READ_BYTES),
                    str(reps),
                ],
            ),
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        return float(out.stdout.strip())
    finally:
        sink.wait(30)


def measure(quick: bool = False) -> list[dict]:
    from cluster import NetnsCluster

    from monarch_nb import this_host

    rows = []
    calls = 50 if quick else 200
    for n_hosts in (2, 4) if quick else (2, 4, 8):
        ranks = n_hosts * RANKS_PER_HOST
        # The same number of ranks on this host, without agents: what the relay
        # costs on top of the core runtime, on the same 2 cores.
        with this_host().spawn_procs({"procs": ranks}, echo_output=False) as procs:
            local = _cast_time(procs, calls)
        with NetnsCluster(n_hosts) as cluster:
            floor = raw_round_trip(cluster, calls)
            started = time.perf_counter()
            hosts = ssh_hosts(
                cluster.hosts, ssh_options=cluster.ssh_options, bind=cluster.controller_address
            )
            try:
                procs = hosts.spawn_procs({"procs": RANKS_PER_HOST}, echo_output=False)
                up = time.perf_counter() - started
                cast = _cast_time(procs, calls)
                rows.append(
                    {
                        "what": f"cast + gather, {n_hosts} hosts x {RANKS_PER_HOST} ranks",
                        "value": cast * 1e6,
                        "unit": "us",
                        "floor_name": "raw pyzmq round trip to one host",
                        "floor": floor * 1e6,
                        "extra": f"{ranks} ranks on one host, no agents: {local * 1e6:.0f} us; "
                        f"mesh up in {up:.1f} s (ssh, agents, {ranks} ranks)",
                    }
                )
                if n_hosts == 2:
                    rows.append(_read_row(cluster, procs, reps=3 if quick else 5))
                procs.stop()
            finally:
                hosts.shutdown()
    return rows


def _cast_time(procs, calls: int) -> float:
    echo = procs.spawn("echo", Echo)
    return median_time(lambda: echo.ping.call().get(timeout=30), calls, warmup=10)


def _read_row(cluster, procs, reps: int) -> dict:
    readers = procs.slice(procs=0).spawn("reader", Reader)
    handle = readers.slice(hosts=0).handle.call_one().get(timeout=60)
    best = readers.slice(hosts=1).read.call_one(handle, reps).get(timeout=300)
    floor = raw_socket_transfer(cluster, reps)
    return {
        "what": "one-sided read host 0 -> host 1, 64 MiB (RDMABuffer, TCP)",
        "value": READ_BYTES / best / 1e9,
        "unit": "GB/s",
        "floor_name": "one plain TCP socket, same path",
        "floor": READ_BYTES / floor / 1e9,
        "extra": "several TCP streams (MONARCH_NB_RDMA_TCP_STREAMS) beat one socket",
    }


def render(rows: list[dict]) -> str:
    lines = [
        "| what | ours | floor (same run) | ratio | note |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        if r["unit"] == "us":
            ours, floor = f"{r['value']:.0f} us", f"{r['floor']:.0f} us ({r['floor_name']})"
            ratio = r["value"] / r["floor"]
        else:
            ours, floor = f"{r['value']:.2f} GB/s", f"{r['floor']:.2f} GB/s ({r['floor_name']})"
            share = r["value"] / r["floor"]
            lines.append(f"| {r['what']} | {ours} | {floor} | {share:.0%} | {r['extra']} |")
            continue
        lines.append(f"| {r['what']} | {ours} | {floor} | {ratio:.1f}x | {r['extra']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 and 4 hosts, fewer calls")
    args = parser.parse_args(argv)
    from cluster import unavailable_reason

    reason = unavailable_reason()
    if reason:
        print(f"skipped: no network-namespace hosts here ({reason})")
        return
    print(render(measure(quick=args.quick)))


if __name__ == "__main__":
    main()
