"""Core runtime figures, each beside a floor measured in the same run.

Run: ``python benchmarks/bench_runtime.py`` (``--quick`` for fewer repetitions).

Floors: a raw pyzmq DEALER/ROUTER round trip between two processes, over the
same transport as a local mesh (an ``ipc://`` socket in a private directory);
the same payload echoed as raw pyzmq frames on it; 4 bare
``python -c "import zmq"`` processes started the same way as workers.
``--echo`` runs the echo rows only (bytes and tensors, 1 and 64 MiB).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import cloudpickle
import torch
from raw_echo import RawEcho, median_time

from monarch_nb import Actor, endpoint, this_host

# Workers cannot import benchmarks/: send this module's actors by value, as if
# they were defined in a notebook, also when another script imports us.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@dataclass
class Row:
    what: str
    ours: float
    floor: float
    unit: str
    floor_what: str
    target: str
    higher_is_better: bool = False

    @property
    def ratio(self) -> float:
        return self.ours / self.floor


class Noop(Actor):
    @endpoint
    def noop(self) -> None:
        return None

    @endpoint
    def echo(self, x: object) -> object:
        return x


def bare_processes(n: int) -> None:
    procs = [
        subprocess.Popen([sys.executable, "-c", "import zmq"], stdin=subprocess.PIPE)
        for _ in range(n)
    ]
    for p in procs:
        p.stdin.close()
        p.wait()


def interleaved_medians(
    fns: list[Callable[[], object]], rounds: int, per_round: int
) -> list[float]:
    """The median time of each of ``fns``, measured in ``rounds`` turns that
    alternate between them (``per_round`` calls each, after one warm-up call): on
    this shared machine the speed of memory moves by 2x within minutes, and a
    floor measured once before the figure it divides would carry that into the
    ratio; alternating, both see the same minutes."""
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for fn, times in zip(fns, samples, strict=True):
            fn()
            for _ in range(per_round):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
    return [statistics.median(times) for times in samples]


def echo_rows(one: object, raw: RawEcho, quick: bool) -> list[Row]:
    """An endpoint echoing its argument (``bytes``, then a torch tensor) against the
    same bytes echoed as raw frames on the same transport, in alternating rounds."""
    rows = []
    for size, label in ((1 << 20, "1 MiB"), (64 << 20, "64 MiB")):
        if size == 1 << 20:
            rounds, per_round = (3 if quick else 10), 20
        else:
            rounds, per_round = (2 if quick else 5), 3
        tensor = torch.ones(size // 4, dtype=torch.float32)
        frame = tensor.numpy()
        payloads = (("bytes", bytes(size)), ("tensor", tensor))
        floor, *ours_all = interleaved_medians(
            [lambda f=frame: raw.round_trip([f])]
            + [lambda p=payload: one.echo.call_one(p).get() for _, payload in payloads],
            rounds,
            per_round,
        )
        for (kind, _), ours in zip(payloads, ours_all, strict=True):
            rows.append(
                Row(
                    f"{label} {kind} argument echo",
                    size / ours / 1e6,  # as the table: payload per round trip
                    size / floor / 1e6,
                    "MB/s",
                    "raw pyzmq frame echo, alternating rounds",
                    ">= 80%",
                    higher_is_better=True,
                )
            )
    return rows


def echo_only(quick: bool) -> list[Row]:
    raw = RawEcho()
    procs = this_host().spawn_procs(per_host={"procs": 1}, name="bench-echo")
    try:
        return echo_rows(procs.spawn("one", Noop), raw, quick)
    finally:
        procs.stop()
        raw.close()


def mesh_to_first_reply(n: int) -> None:
    procs = this_host().spawn_procs(per_host={"procs": n}, name="bench-start")
    try:
        procs.spawn("noop", Noop).noop.call().get(timeout=60)
    finally:
        procs.stop()


def run(quick: bool = False) -> list[Row]:
    reps = 200 if quick else 1000
    rows: list[Row] = []
    raw = RawEcho()
    procs = this_host().spawn_procs(per_host={"procs": 4}, name="bench")
    try:
        one = procs.slice(procs=0).spawn("one", Noop)
        four = procs.spawn("four", Noop)
        sixteen = [procs.spawn(f"sixteen{i}", Noop) for i in range(4)]

        raw_rt = median_time(lambda: raw.round_trip([b"x"]), reps)
        rows.append(
            Row(
                "no-op call_one round trip",
                median_time(lambda: one.noop.call_one().get(), reps),
                raw_rt,
                "us",
                "raw pyzmq round trip",
                "<= 2x (aim 1.3x)",
            )
        )
        rows.append(
            Row(
                "call() gathered from 4 procs",
                median_time(lambda: four.noop.call().get(), reps),
                raw_rt,
                "us",
                "raw pyzmq round trip",
                "",
            )
        )

        def gather16() -> None:
            for fut in [mesh.noop.call() for mesh in sixteen]:
                fut.get()

        rows.append(
            Row(
                "call() gathered from 16 actors in 4 procs",
                median_time(gather16, reps),
                raw_rt,
                "us",
                "raw pyzmq round trip",
                "<= 8x",
            )
        )

        n = 2000 if quick else 10000

        def pipelined_ours() -> None:
            futures = [one.noop.call_one() for _ in range(n)]
            for fut in futures:
                fut.get()

        ours_s = median_time(pipelined_ours, 3, warmup=1)
        raw_s = median_time(lambda: raw.pipelined(n), 3, warmup=1)
        rows.append(
            Row(
                "pipelined call_one",
                n / ours_s,
                n / raw_s,
                "calls/s",
                "raw pyzmq pipelined messages/s",
                "",
                higher_is_better=True,
            )
        )

        rows += echo_rows(one, raw, quick)
    finally:
        procs.stop()
        raw.close()

    starts = 3 if quick else 7
    rows.append(
        Row(
            "4-process mesh to first reply",
            median_time(lambda: mesh_to_first_reply(4), starts, warmup=1),
            median_time(lambda: bare_processes(4), starts, warmup=1),
            "s",
            "4 bare python -c 'import zmq'",
            "<= 2x",
        )
    )
    return rows


def table(rows: list[Row]) -> str:
    lines = [
        "| what | monarch_nb | floor (same run) | ratio | target |",
        "|---|---:|---:|---:|---|",
    ]
    for r in rows:
        scale = 1e6 if r.unit == "us" else 1.0
        fmt = "{:,.0f}" if r.unit in ("us", "calls/s", "MB/s") else "{:.3f}"
        ours = fmt.format(r.ours * scale) + f" {r.unit}"
        floor = fmt.format(r.floor * scale) + f" {r.unit} ({r.floor_what})"
        ratio = f"{r.ratio:.0%}" if r.higher_is_better else f"{r.ratio:.2f}x"
        lines.append(f"| {r.what} | {ours} | {floor} | {ratio} | {r.target} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--echo", action="store_true", help="the echo rows only")
    args = parser.parse_args(argv)
    print(table(echo_only(args.quick) if args.echo else run(quick=args.quick)))


if __name__ == "__main__":
    main()
