"""Scale: a call gathered from hundreds to a thousand lightweight ranks.

Run: ``python benchmarks/bench_scale.py`` (``--quick``: the 256-rank rows only;
``--cpu``: where the 1,024-rank gather's CPU goes, thread by thread;
``--processes [N ...]``: what many single-process ranks cost to start and to
keep, default 256 and 1,024, against as many bare echo processes; ranks fork
from the zygote, as by default, or with ``MONARCH_NB_ZYGOTE=0`` each is a fresh
interpreter, as the floor's processes are).

A *rank* here is one actor: ``A`` actor meshes spawned on a process mesh of
``P`` workers give ``P * A`` ranks, and one gather is ``A`` calls (one per actor
mesh) awaited together, ``P * A`` replies in all. Workers import no torch.

Floor, measured in the same run: a raw pyzmq scatter/gather of the same
number of messages to the same number of bare ``python`` echo processes
(ROUTER on this side, one DEALER per process), divided per rank the same way.
Reference, not measured here: Monarch's published figure, 2.6 ms for a cast
gathered from 512 actors (about 5.1 us per actor).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import cloudpickle
import psutil
from raw_echo import RawEcho, median_time

from monarch_nb import Actor, endpoint, this_host

# Workers cannot import benchmarks/: send this module's actors by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MONARCH_512_ACTORS_S = 2.6e-3


class Tiny(Actor):
    @endpoint
    def ping(self) -> int:
        return 0

    @endpoint
    def imported_torch(self) -> bool:
        return "torch" in sys.modules


@dataclass
class ScaleRow:
    procs: int
    actors_per_proc: int
    start_s: float  # spawn_procs plus every actor mesh spawned
    gather_s: float  # median time of one gather from every rank
    floor_s: float  # raw pyzmq scatter/gather of the same messages
    controller_rss: int  # bytes, after the gathers
    workers_rss: int  # bytes, all workers together

    @property
    def ranks(self) -> int:
        return self.procs * self.actors_per_proc


def measure_one(procs: int, actors_per_proc: int, repeat: int) -> ScaleRow:
    t0 = time.perf_counter()
    # 256 processes on 2 cores is past the sanity limit on purpose: force it.
    mesh = this_host().spawn_procs(
        per_host={"procs": procs}, name="scale", echo_output=False, force=True
    )
    try:
        actors = [mesh.spawn(f"tiny{i}", Tiny) for i in range(actors_per_proc)]
        start_s = time.perf_counter() - t0
        if any(actors[0].imported_torch.call().get(timeout=60).values()):
            raise AssertionError("a worker imported torch: ranks are not lightweight")

        def gather() -> None:
            futures = [a.ping.call() for a in actors]
            for future in futures:
                future.get(timeout=60)

        gather_s = median_time(gather, repeat, warmup=3)
        controller_rss = psutil.Process().memory_info().rss
        workers_rss = sum(psutil.Process(pid).memory_info().rss for pid in mesh.pids)
    finally:
        mesh.stop()
    raw = RawEcho("tcp://127.0.0.1", peers=procs)
    try:
        floor_s = median_time(lambda: raw.gather(actors_per_proc), repeat, warmup=3)
    finally:
        raw.close()
    return ScaleRow(procs, actors_per_proc, start_s, gather_s, floor_s, controller_rss, workers_rss)


def _pss(pid: int) -> int:
    """A process's proportional set size in bytes (shared pages split among their
    users): what it costs the host, counted once across many processes."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@dataclass
class ProcessesRow:
    procs: int
    start_s: float  # spawn_procs, one actor each, and its first gather answered
    floor_start_s: float  # as many bare echo processes started and gathered once
    pss: int  # bytes, every worker together, after the gather
    floor_pss: int
    gather_s: float
    floor_gather_s: float


@contextmanager
def _tiny_ranks(procs: int, name: str) -> Iterator[tuple[Any, Any, float]]:
    """``(mesh, actors, start_s)``: ``procs`` single-process ranks with a Tiny actor
    each, and the seconds from the start to their first gather answered; the mesh
    stops after."""
    t0 = time.perf_counter()
    mesh = this_host().spawn_procs(
        per_host={"procs": procs}, name=name, echo_output=False, force=True
    )
    try:
        actors = mesh.spawn("tiny", Tiny)
        actors.ping.call().get(timeout=600)
        yield mesh, actors, time.perf_counter() - t0
    finally:
        mesh.stop()


def measure_processes(procs: int, repeat: int = 20) -> ProcessesRow:
    """Single-process ranks: start to the first gather, memory, a gather; then the
    floor, ``procs`` bare pyzmq echo processes, the same way."""
    with _tiny_ranks(procs, "scale") as (mesh, actors, start_s):
        pss = sum(_pss(pid) for pid in mesh.pids)
        gather_s = median_time(lambda: actors.ping.call().get(timeout=60), repeat, warmup=3)
    t0 = time.perf_counter()
    raw = RawEcho("tcp://127.0.0.1", peers=procs)
    try:
        raw.gather(1)
        floor_start_s = time.perf_counter() - t0
        floor_pss = sum(_pss(child.pid) for child in raw.children)
        floor_gather_s = median_time(lambda: raw.gather(1), repeat, warmup=3)
    finally:
        raw.close()
    return ProcessesRow(procs, start_s, floor_start_s, pss, floor_pss, gather_s, floor_gather_s)


def zygote_ab(procs: int, pairs: int = 2, repeat: int = 30) -> str:
    """Start to first gather and a gather of ``procs`` single-process ranks, forked
    from the zygote against fresh interpreters, alternating in this process (a
    load that drifts hits both): the comparison that holds on a busy machine."""
    lines = [
        f"| {procs:,} single-process ranks | start to first gather | cast + gather |",
        "|---|---:|---:|",
    ]
    saved = os.environ.get("MONARCH_NB_ZYGOTE")
    try:
        for _ in range(pairs):
            for mode, label in (("1", "forked from the zygote"), ("0", "fresh interpreters")):
                os.environ["MONARCH_NB_ZYGOTE"] = mode  # read at each rank's start
                with _tiny_ranks(procs, "ab") as (_, actors, start_s):
                    gather_s = median_time(
                        lambda a=actors: a.ping.call().get(timeout=60), repeat, warmup=5
                    )
                lines.append(f"| {label} | {start_s:.2f} s | {gather_s * 1e3:.1f} ms |")
    finally:
        if saved is None:
            os.environ.pop("MONARCH_NB_ZYGOTE", None)
        else:
            os.environ["MONARCH_NB_ZYGOTE"] = saved
    return "\n".join(lines)


def render_processes(rows: list[ProcessesRow]) -> str:
    mib = 1 << 20
    fresh = os.environ.get("MONARCH_NB_ZYGOTE", "1").strip().lower() in ("0", "false", "no", "off")
    how = "each a fresh interpreter (MONARCH_NB_ZYGOTE=0)" if fresh else "forked from the zygote"
    lines = [
        f"monarch_nb's ranks: {how}; the floor's: fresh interpreters.",
        "",
        "| single-process ranks | metric | floor (bare pyzmq echo processes) "
        "| monarch_nb | ratio |",
        "|---|---|---:|---:|---:|",
    ]
    for r in rows:
        lines += [
            f"| {r.procs:,} | start to first gather | {r.floor_start_s:.2f} s "
            f"| {r.start_s:.2f} s | {r.start_s / r.floor_start_s:.2f}x |",
            f"| {r.procs:,} | workers' memory (PSS) | {r.floor_pss / mib:.0f} MiB "
            f"({r.floor_pss / r.procs / mib:.1f} each) | {r.pss / mib:.0f} MiB "
            f"({r.pss / r.procs / mib:.1f} each) | {r.pss / r.floor_pss:.2f}x |",
            f"| {r.procs:,} | cast + gather | {r.floor_gather_s * 1e3:.1f} ms "
            f"| {r.gather_s * 1e3:.1f} ms | {r.gather_s / r.floor_gather_s:.2f}x |",
        ]
    return "\n".join(lines)


def measure(quick: bool = False) -> list[ScaleRow]:
    configs = [(64, 4)] if quick else [(64, 4), (256, 1), (128, 8)]
    repeat = 20 if quick else 50
    return [measure_one(p, a, repeat) for p, a in configs]


def render(rows: list[ScaleRow]) -> str:
    lines = [
        "| ranks (procs x actors) | gather | per rank | raw pyzmq gather (same run) "
        "| per rank | ratio | mesh start | controller RSS | workers RSS |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.ranks:,} ({r.procs} x {r.actors_per_proc}) "
            f"| {r.gather_s * 1e3:.2f} ms | {r.gather_s / r.ranks * 1e6:.1f} us "
            f"| {r.floor_s * 1e3:.2f} ms | {r.floor_s / r.ranks * 1e6:.1f} us "
            f"| {r.gather_s / r.floor_s:.2f}x | {r.start_s:.1f} s "
            f"| {r.controller_rss / 2**20:.0f} MiB | {r.workers_rss / 2**30:.2f} GiB |"
        )
    per_actor_us = MONARCH_512_ACTORS_S / 512 * 1e6
    lines.append(
        "\nReference (published, not measured here): Monarch, "
        f"{MONARCH_512_ACTORS_S * 1e3:.1f} ms for a cast gathered from 512 actors "
        f"({per_actor_us:.1f} us per actor)."
    )
    return "\n".join(lines)


def _thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of each thread of ``pid``, keyed ``main`` for
    its main thread and by thread name for the others (summed per name)."""
    tick = os.sysconf("SC_CLK_TCK")
    cpu: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        name = "main" if tid == str(pid) else stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        cpu[name] = cpu.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return cpu


def cpu_per_gather(procs: int = 128, actors_per_proc: int = 8, gathers: int = 40) -> str:
    """Where a gather's CPU goes: the controller's threads and the workers' (all
    workers summed), per gather, over ``gathers`` gathers in a row."""
    mesh = this_host().spawn_procs(
        per_host={"procs": procs}, name="scale", echo_output=False, force=True
    )
    try:
        actors = [mesh.spawn(f"tiny{i}", Tiny) for i in range(actors_per_proc)]

        def gather() -> None:
            for future in [a.ping.call() for a in actors]:
                future.get(timeout=60)

        for _ in range(3):
            gather()
        pids = {"controller": [os.getpid()], "workers": list(mesh.pids)}
        before = {side: [_thread_cpu(p) for p in ps] for side, ps in pids.items()}
        t0 = time.perf_counter()
        for _ in range(gathers):
            gather()
        wall = (time.perf_counter() - t0) / gathers
        after = {side: [_thread_cpu(p) for p in ps] for side, ps in pids.items()}
    finally:
        mesh.stop()
    lines = [
        f"{procs * actors_per_proc:,} ranks ({procs} x {actors_per_proc}), {gathers} gathers: "
        f"{wall * 1e3:.1f} ms a gather (wall)",
        "",
        "| process | thread | CPU per gather |",
        "|---|---|---:|",
    ]
    for side in pids:
        spent: dict[str, float] = {}
        for old, new in zip(before[side], after[side], strict=True):
            for name, seconds in new.items():
                spent[name] = spent.get(name, 0.0) + seconds - old.get(name, 0.0)
        for name, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
            if seconds / gathers >= 1e-4:
                lines.append(f"| {side} | {name} | {seconds / gathers * 1e3:.1f} ms |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the 256-rank rows only")
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="the 1,024-rank layout only: each thread's CPU per gather, from /proc",
    )
    parser.add_argument(
        "--processes",
        type=int,
        nargs="*",
        metavar="N",
        help="single-process ranks: start, memory (PSS) and a gather against the floor "
        "(default 256 and 1024)",
    )
    parser.add_argument(
        "--zygote-ab",
        type=int,
        metavar="N",
        help="N single-process ranks forked from the zygote against fresh interpreters, "
        "alternating, twice each (no floor)",
    )
    args = parser.parse_args(argv)
    if args.zygote_ab:
        print(zygote_ab(args.zygote_ab))
    elif args.processes is not None:
        sizes = args.processes or [256, 1024]
        print(render_processes([measure_processes(n) for n in sizes]))
    else:
        print(cpu_per_gather() if args.cpu else render(measure(quick=args.quick)))


if __name__ == "__main__":
    main()
