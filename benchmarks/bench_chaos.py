"""Hardening figures: faults, load and bad input, each beside a floor from the same run.

Run: ``python benchmarks/bench_chaos.py`` (``--quick``: fewer trials, 100,000
calls instead of 1 million, 100,000 lines instead of 1 million).

Floors: a raw child's death seen through its pidfd (detection); 4 bare
``python -c "import zmq"`` processes (restart); a child killed by the kernel
through ``PR_SET_PDEATHSIG`` when its parent dies (orphans); raw pyzmq
pipelined messages (calls, casts); raw pipes read line by line (output
floods); a raw pyzmq ROUTER that just reads the frames (fuzzing).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import random
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass

import cloudpickle
import psutil
import zmq

from monarch_nb import Actor, MeshFailure, current_rank, endpoint, this_host
from monarch_nb.events import Output

# Workers cannot import benchmarks/: send this module's actors by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Probe(Actor):
    @endpoint
    def echo(self, x: object) -> object:
        return x

    @endpoint
    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    @endpoint
    def rank(self) -> int:
        return current_rank().rank

    @endpoint
    def flood(self, lines: int) -> int:
        write, rank = sys.stdout.write, current_rank().rank
        for i in range(lines):
            write(f"line {i} of rank {rank}\n")
        sys.stdout.flush()
        return lines


TRIPPED: list[str] = []


def _trip(tag: str) -> str:
    TRIPPED.append(tag)
    return tag


class _Canary:
    def __reduce__(self):
        return (_trip, ("unsigned frame was unpickled",))


@dataclass
class Row:
    what: str
    ours: float
    floor: float | None
    unit: str
    floor_what: str
    note: str = ""

    def cell(self, value: float | None) -> str:
        if value is None:
            return "-"
        if self.unit == "s":
            return f"{value * 1e3:,.1f} ms"
        if self.unit == "MiB":
            return f"{value:,.2f} MiB"
        return f"{value:,.0f} {self.unit}"

    @property
    def ratio(self) -> str:
        if not self.floor:
            return "-"
        if self.unit == "s":
            return f"{self.ours / self.floor:.2f}x"
        return f"{self.ours / self.floor:.0%}"


def _gone(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.add(pid)
        except psutil.NoSuchProcess:
            pass
    return pids - alive


def _wait_gone(pids: set[int], timeout: float) -> int:
    """Wait until every pid is gone; how many are still alive after ``timeout``."""
    deadline = time.monotonic() + timeout
    while len(_gone(pids)) < len(pids) and time.monotonic() < deadline:
        time.sleep(0.005)
    return len(pids) - len(_gone(pids))


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


# -- faults -----------------------------------------------------------------------------


def kill_trials(trials: int, seed: int = 7) -> list[Row]:
    """SIGKILL a random rank mid-call, ``trials`` times: detection, lost calls, restart."""
    rng = random.Random(seed)
    detection, restart, lost, returned, orphans = [], [], 0, 0, 0
    procs = this_host().spawn_procs(per_host={"procs": 4}, name="chaos", echo_output=False)
    try:
        for _ in range(trials):
            probe = procs.spawn("probe", Probe)
            victim = rng.randrange(4)
            echoes = [
                (i, probe.slice(procs=r).echo.call_one(i)) for i in range(50) for r in range(4)
            ]
            busy = probe.slice(procs=victim).sleep.call_one(30)
            for i, future in echoes:
                lost += future.get(timeout=30) != i
                returned += 1
            pids = set(procs.pids)
            t0 = time.perf_counter()
            os.kill(procs.pids[victim], signal.SIGKILL)
            try:
                busy.get(timeout=30)
            except MeshFailure:
                detection.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            procs.restart()
            procs.spawn("first", Probe).rank.call().get(timeout=30)
            restart.append(time.perf_counter() - t0)
            orphans += _wait_gone(pids, 5)
    finally:
        procs.stop()
    floor_detect = [_raw_detection() for _ in range(trials)]
    floor_start = [_bare_processes(4) for _ in range(min(trials, 5))]
    return [
        Row(
            f"SIGKILL of a random rank mid-call -> MeshFailure (median of {trials})",
            _median(detection),
            _median(floor_detect),
            "s",
            "raw child's death seen on its pidfd",
            f"max {max(detection) * 1e3:.1f} ms; {trials - len(detection)} undetected",
        ),
        Row(
            "restart() + spawn + first reply, 4 procs",
            _median(restart),
            _median(floor_start),
            "s",
            "4 bare python -c 'import zmq'",
        ),
        Row(
            "calls lost among those that returned",
            lost,
            None,
            "calls",
            "",
            f"of {returned:,} returned; must be 0",
        ),
        Row("orphans left after the kills and restarts", orphans, None, "procs", "", "must be 0"),
    ]


def _raw_detection() -> float:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    fd = os.pidfd_open(child.pid)
    try:
        t0 = time.perf_counter()
        os.kill(child.pid, signal.SIGKILL)
        select.select([fd], [], [], 10)
        return time.perf_counter() - t0
    finally:
        os.close(fd)
        child.wait()


def _bare_processes(n: int) -> float:
    t0 = time.perf_counter()
    children = [subprocess.Popen([sys.executable, "-c", "import zmq"]) for _ in range(n)]
    for child in children:
        child.wait()
    return time.perf_counter() - t0


_CONTROLLER = textwrap.dedent(
    """
    import json, sys, time
    from monarch_nb import this_host
    procs = this_host().spawn_procs(per_host={"procs": 4}, echo_output=False)
    print(json.dumps(procs.pids), flush=True)
    time.sleep(600)
    """
)
_PDEATHSIG_PARENT = textwrap.dedent(
    """
    import subprocess, sys
    child = subprocess.Popen([sys.executable, "-c",
        "import ctypes, signal, time; ctypes.CDLL(None).prctl(1, signal.SIGKILL); "
        "print(flush=True); time.sleep(600)"], stdout=subprocess.PIPE)
    child.stdout.readline()
    print(child.pid, flush=True)
    import time; time.sleep(600)
    """
)


def controller_kill_trials(trials: int) -> list[Row]:
    """SIGKILL a controller script: how long until its 4 workers are gone, and orphans."""
    ours, floor, orphans = [], [], 0
    for _ in range(trials):
        elapsed, left = _kill_parent(_CONTROLLER, lambda line: set(json.loads(line)))
        ours.append(elapsed)
        orphans += left
        elapsed, left = _kill_parent(_PDEATHSIG_PARENT, lambda line: {int(line)})
        floor.append(elapsed)
    return [
        Row(
            f"controller SIGKILLed -> all 4 workers gone (median of {trials})",
            _median(ours),
            _median(floor),
            "s",
            "child killed by PR_SET_PDEATHSIG",
            f"orphans: {orphans} (must be 0)",
        )
    ]


def _kill_parent(script: str, parse) -> tuple[float, int]:
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pids = parse(parent.stdout.readline())
        t0 = time.perf_counter()
        parent.kill()
        left = _wait_gone(pids, 10)
        return time.perf_counter() - t0, left
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()


# -- load -------------------------------------------------------------------------------


def _rss_mib() -> float:
    gc.collect()
    return psutil.Process().memory_info().rss / 2**20


class _RawEcho:
    def __init__(self) -> None:
        from raw_echo import RawEcho

        self.raw = RawEcho("tcp://127.0.0.1")

    def pipelined(self, n: int) -> float:
        t0 = time.perf_counter()
        for start in range(0, n, 1000):
            self.raw.gather(min(1000, n - start))
        return time.perf_counter() - t0


def call_load(calls: int, casts: int) -> list[Row]:
    procs = this_host().spawn_procs(per_host={"procs": 4}, name="load", echo_output=False)
    try:
        one = procs.slice(procs=0).spawn("one", Probe)
        every = procs.spawn("every", Probe)

        def pipelined(n: int) -> None:
            for start in range(0, n, 1000):
                futures = [one.echo.call_one(i) for i in range(start, min(n, start + 1000))]
                for future in futures:
                    future.get(timeout=60)

        pipelined(5000)
        before = _rss_mib()
        t0 = time.perf_counter()
        pipelined(calls)
        calls_s = time.perf_counter() - t0
        middle = _rss_mib()
        t0 = time.perf_counter()
        for i in range(casts):
            every.echo.broadcast(i)
        every.rank.call().get(timeout=120)  # in order after every cast
        casts_s = time.perf_counter() - t0
        after = _rss_mib()
    finally:
        procs.stop()
    raw = _RawEcho()
    try:
        raw_calls_s = raw.pipelined(min(calls, 200_000)) / min(calls, 200_000) * calls
        raw_casts_s = raw.pipelined(4 * casts) / 4  # 4 messages per cast
    finally:
        raw.raw.close()
    return [
        Row(
            f"{calls:,} pipelined call_one",
            calls / calls_s,
            calls / raw_calls_s,
            "calls/s",
            "raw pyzmq pipelined messages/s",
            f"controller RSS {before:.1f} -> {middle:.1f} MiB ({middle - before:+.2f})",
        ),
        Row(
            f"{casts:,} casts to 4 ranks",
            casts / casts_s,
            casts / raw_casts_s,
            "casts/s",
            "raw pyzmq, 4 messages per cast",
            f"controller RSS {middle:.1f} -> {after:.1f} MiB ({after - middle:+.2f})",
        ),
    ]


_RAW_WRITER = (
    "import sys\nw = sys.stdout.write\n"
    "for i in range({n}): w(f'line {{i}} of rank {r}\\n')\nsys.stdout.flush()\n"
)


def output_flood(total_lines: int, ranks: int = 8) -> list[Row]:
    per_rank = total_lines // ranks
    procs = this_host().spawn_procs(per_host={"procs": ranks + 1}, name="flood", echo_output=False)
    received = [0]
    all_in = threading.Event()

    def count(event: Output) -> None:
        received[0] += 1
        if received[0] == per_rank * ranks:
            all_in.set()

    try:
        probe = procs.spawn("probe", Probe)
        quiet = probe.slice(procs=ranks)
        latencies = []
        with procs.events.subscribe(count, kinds=(Output,)):
            t0 = time.perf_counter()
            flood = probe.slice(procs=slice(0, ranks)).flood.call(per_rank)
            while not all_in.is_set():
                t1 = time.perf_counter()
                quiet.rank.call_one().get(timeout=60)
                latencies.append(time.perf_counter() - t1)
                all_in.wait(0.05)
            elapsed = time.perf_counter() - t0
            flood.get(timeout=60)
    finally:
        procs.stop()
    raw = _raw_flood(per_rank, ranks)
    return [
        Row(
            f"{per_rank * ranks:,} output lines from {ranks} ranks, all received",
            per_rank * ranks / elapsed,
            per_rank * ranks / raw,
            "lines/s",
            f"{ranks} raw pipes read line by line",
            f"a call to a 9th rank meanwhile: max {max(latencies) * 1e3:.1f} ms, "
            f"median {_median(latencies) * 1e3:.1f} ms ({len(latencies)} calls)",
        )
    ]


def _raw_flood(per_rank: int, ranks: int) -> float:
    t0 = time.perf_counter()
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _RAW_WRITER.format(n=per_rank, r=r)], stdout=subprocess.PIPE
        )
        for r in range(ranks)
    ]
    lines = 0
    open_pipes = {c.stdout.fileno(): c for c in children}
    while open_pipes:
        readable, _, _ = select.select(list(open_pipes), [], [])
        for fd in readable:
            chunk = os.read(fd, 65536)
            if not chunk:
                open_pipes.pop(fd).stdout.close()
            lines += chunk.count(b"\n")
    for c in children:
        c.wait()
    assert lines == per_rank * ranks
    return time.perf_counter() - t0


# -- bad input --------------------------------------------------------------------------


def controller_address(procs) -> str:
    """The controller's ROUTER endpoint: this file's one reach into runtime internals."""
    return procs._group.controller.address


def fuzz_frames(frames: int, seed: int = 11) -> list[Row]:
    """Random, forged and truncated frames from an anonymous rogue to the controller."""
    rng = random.Random(seed)
    canary = pickle.dumps(_Canary())
    messages = []
    for _ in range(frames):
        kind = rng.randrange(3)
        if kind == 0:
            messages.append([rng.randbytes(rng.randrange(0, 512))])
        elif kind == 1:
            header = rng.randbytes(40) + len(canary).to_bytes(4, "little")
            messages.append([header + canary, canary])
        else:
            messages.append([rng.randbytes(44)[: rng.randrange(44)]])
    procs = this_host().spawn_procs(per_host={"procs": 2}, name="fuzz", echo_output=False)
    ctx = zmq.Context.instance()
    rogue = ctx.socket(zmq.DEALER)
    rogue.setsockopt(zmq.LINGER, 0)
    try:
        probe = procs.spawn("probe", Probe)
        stats = procs.status().wire
        rogue.connect(controller_address(procs))
        t0 = time.perf_counter()
        for message in messages:
            rogue.send_multipart(message)
        deadline = time.monotonic() + 60
        while procs.status().wire.dropped_unknown_peer - stats.dropped_unknown_peer < frames:
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        elapsed = time.perf_counter() - t0
        counted = procs.status().wire.dropped_unknown_peer - stats.dropped_unknown_peer
        answers = probe.rank.call().get(timeout=30).values() == [0, 1]
    finally:
        rogue.close(0)
        procs.stop()
    raw = _raw_sink(messages)
    return [
        Row(
            f"{frames:,} fuzzed frames to the controller, dropped and counted",
            counted / elapsed,
            frames / raw,
            "frames/s",
            "raw pyzmq ROUTER reading them",
            f"counted {counted:,}/{frames:,}; unpickled {len(TRIPPED)} (must be 0); "
            f"mesh answers afterwards: {answers}",
        )
    ]


def _raw_sink(messages: list[list[bytes]]) -> float:
    ctx = zmq.Context.instance()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    for sock in (router, dealer):  # all is sent before anything is read: no limits
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer.connect(f"tcp://127.0.0.1:{port}")
    try:
        t0 = time.perf_counter()
        for message in messages:
            dealer.send_multipart(message)
        for _ in messages:
            router.recv_multipart(copy=False)
        return time.perf_counter() - t0
    finally:
        router.close(0)
        dealer.close(0)


# -- all --------------------------------------------------------------------------------


def measure(quick: bool = False) -> list[Row]:
    rows = kill_trials(5 if quick else 20)
    rows += controller_kill_trials(3 if quick else 10)
    rows += call_load(100_000 if quick else 1_000_000, 10_000)
    rows += output_flood(100_000 if quick else 1_000_000)
    rows += fuzz_frames(10_000 if quick else 100_000)
    return rows


def render(rows: list[Row]) -> str:
    lines = [
        "| what | monarch_nb | floor (same run) | ratio | notes |",
        "|---|---:|---:|---:|---|",
    ]
    for r in rows:
        floor = f"{r.cell(r.floor)} ({r.floor_what})" if r.floor is not None else "-"
        lines.append(f"| {r.what} | {r.cell(r.ours)} | {floor} | {r.ratio} | {r.note} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer trials and smaller loads")
    args = parser.parse_args(argv)
    print(render(measure(quick=args.quick)))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
