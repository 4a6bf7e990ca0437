"""Actors talking to actors, beside the controller calling them and raw pyzmq, in one run.

Run: ``python benchmarks/bench_actors.py`` (``--quick`` for fewer repetitions;
``--profile`` adds a cProfile of the calling actor's main thread).

Two processes of one mesh: a ``Caller`` actor on rank 0 holds a reference to a
``Noop`` actor on rank 1 and times its own calls to it (the figures are taken
inside the calling actor). The controller calls the same ``Noop`` actor the
same ways. The paths take turns, round by round, and each figure is the
median of its rounds, so load from elsewhere falls on all alike. Floors: a
raw pyzmq DEALER/ROUTER echo between two processes, over ``ipc://`` (the
transport actor-to-actor calls use) and over TCP loopback (the transport of
the controller's wire). Last, the controller's own CPU time
(``time.process_time()``: every thread of the controller's process) while the
caller makes 10,000 calls, beside the same process idle for as long.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import cloudpickle
from raw_echo import RawEcho, median_time

from monarch_nb import Actor, endpoint, this_host

# Workers cannot import benchmarks/: send this module's actors by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Noop(Actor):
    @endpoint
    def noop(self) -> None:
        return None


class AwaitingCaller(Actor):
    """Caller's awaiting round trip (one actor's endpoints are all def or all async def)."""

    def __init__(self, target: object) -> None:
        self.target = target

    @endpoint
    async def round_trip_await(self, repeat: int) -> float:
        target = self.target
        for _ in range(20):
            await target.noop.call_one()
        samples = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            await target.noop.call_one()
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples)


class Caller(Actor):
    """Calls the ``Noop`` mesh it was given and times the calls where it makes them."""

    def __init__(self, target: object) -> None:
        self.target = target

    @endpoint
    def round_trip(self, repeat: int) -> float:
        target = self.target
        return median_time(lambda: target.noop.call_one().get(), repeat)

    @endpoint
    def pipelined(self, n: int, repeat: int) -> float:
        target = self.target

        def burst() -> None:
            futures = [target.noop.call_one() for _ in range(n)]
            for fut in futures:
                fut.get()

        return median_time(burst, repeat, warmup=1)

    @endpoint
    def calls(self, n: int) -> float:
        """``n`` round trips one after another; the wall time they took."""
        target = self.target
        t0 = time.perf_counter()
        for _ in range(n):
            target.noop.call_one().get()
        return time.perf_counter() - t0

    @endpoint
    def profile(self, n: int) -> str:
        """cProfile of this thread over ``n`` round trips, the top entries by own time."""
        import cProfile
        import io
        import pstats

        target = self.target
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(n):
            target.noop.call_one().get()
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
        return out.getvalue()


@dataclass
class Figures:
    rounds: int
    repeat: int  # round trips per path, in all rounds
    burst: int
    cpu_calls: int
    rt: dict[str, float]  # seconds per round trip, by path
    rate: dict[str, float]  # calls (messages) per second, by path
    cpu_busy: float  # controller CPU seconds during cpu_calls actor->actor calls
    cpu_busy_wall: float
    cpu_idle: float  # controller CPU seconds idle for as long
    cpu_controller_calls: float  # controller CPU seconds for cpu_calls calls of its own
    profile: str = ""


def run(quick: bool = False, profile: bool = False) -> Figures:
    # Rounds alternate between the paths, so that load from elsewhere on the
    # machine falls on all of them alike; each figure is the median of its rounds.
    rounds = 3 if quick else 5
    repeat = 300 if quick else 2000
    burst = 1000 if quick else 5000
    cpu_calls = 10_000
    samples: dict[str, list[float]] = {}
    bursts: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-actors-") as tmp:
        raw = {"ipc": RawEcho(f"ipc://{tmp}/echo"), "tcp": RawEcho("tcp://127.0.0.1")}
        procs = this_host().spawn_procs(per_host={"procs": 2}, name="bench-actors")
        try:
            target = procs.slice(procs=1).spawn("noop", Noop)
            caller = procs.slice(procs=0).spawn("caller", Caller, target)
            awaiting = procs.slice(procs=0).spawn("awaiting_caller", AwaitingCaller, target)
            per_round = repeat // rounds

            def burst_from_controller() -> None:
                futures = [target.noop.call_one() for _ in range(burst)]
                for fut in futures:
                    fut.get()

            round_trip: dict[str, Callable[[], float]] = {
                "actor": lambda: caller.round_trip.call_one(per_round).get(),
                "actor_await": lambda: awaiting.round_trip_await.call_one(per_round).get(),
                "controller": lambda: median_time(lambda: target.noop.call_one().get(), per_round),
                "ipc": lambda: median_time(raw["ipc"].round_trip, per_round),
                "tcp": lambda: median_time(raw["tcp"].round_trip, per_round),
            }
            pipelined: dict[str, Callable[[], float]] = {
                "actor": lambda: caller.pipelined.call_one(burst, 1).get(),
                "controller": lambda: median_time(burst_from_controller, 1, warmup=1),
                "ipc": lambda: median_time(lambda: raw["ipc"].pipelined(burst), 1, warmup=1),
                "tcp": lambda: median_time(lambda: raw["tcp"].pipelined(burst), 1, warmup=1),
            }
            for _ in range(rounds):
                for key, measure in round_trip.items():
                    samples.setdefault(key, []).append(measure())
                for key, measure in pipelined.items():
                    bursts.setdefault(key, []).append(measure())

            caller.calls.call_one(100).get()  # warm
            cpu0 = time.process_time()
            wall0 = time.perf_counter()
            caller.calls.call_one(cpu_calls).get()
            cpu_busy_wall = time.perf_counter() - wall0
            cpu_busy = time.process_time() - cpu0

            cpu0 = time.process_time()
            time.sleep(cpu_busy_wall)
            cpu_idle = time.process_time() - cpu0

            cpu0 = time.process_time()
            for _ in range(cpu_calls):
                target.noop.call_one().get()
            cpu_controller_calls = time.process_time() - cpu0

            text = caller.profile.call_one(repeat).get() if profile else ""
        finally:
            procs.stop()
            for echo in raw.values():
                echo.close()
    return Figures(
        rounds,
        repeat,
        burst,
        cpu_calls,
        {key: statistics.median(values) for key, values in samples.items()},
        {key: burst / statistics.median(values) for key, values in bursts.items()},
        cpu_busy,
        cpu_busy_wall,
        cpu_idle,
        cpu_controller_calls,
        text,
    )


def table(f: Figures) -> str:
    def us(seconds: float) -> str:
        return f"{seconds * 1e6:,.0f} us"

    def per_s(value: float) -> str:
        return f"{value:,.0f}/s"

    lines = [
        "| what | actor -> actor | controller -> actor | raw pyzmq ipc:// | raw pyzmq tcp "
        "loopback | actor/controller | actor/raw ipc | controller/raw tcp |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        f"| no-op call_one round trip, `.get()` ({f.repeat // f.rounds:,} a round) "
        f"| {us(f.rt['actor'])} | {us(f.rt['controller'])} | {us(f.rt['ipc'])} "
        f"| {us(f.rt['tcp'])} | {f.rt['actor'] / f.rt['controller']:.2f}x "
        f"| {f.rt['actor'] / f.rt['ipc']:.2f}x | {f.rt['controller'] / f.rt['tcp']:.2f}x |",
        f"| no-op call_one round trip, `await` in an async endpoint "
        f"| {us(f.rt['actor_await'])} | | | "
        f"| {f.rt['actor_await'] / f.rt['controller']:.2f}x "
        f"| {f.rt['actor_await'] / f.rt['ipc']:.2f}x | |",
        f"| pipelined call_one ({f.burst:,} futures, then get all; one burst a round) "
        f"| {per_s(f.rate['actor'])} | {per_s(f.rate['controller'])} "
        f"| {per_s(f.rate['ipc'])} | {per_s(f.rate['tcp'])} "
        f"| {f.rate['actor'] / f.rate['controller']:.0%} "
        f"| {f.rate['actor'] / f.rate['ipc']:.0%} "
        f"| {f.rate['controller'] / f.rate['tcp']:.0%} |",
        "",
        "| controller CPU time (`time.process_time()`, all its threads) | total | per call |",
        "|---|---:|---:|",
        f"| during {f.cpu_calls:,} actor -> actor round trips ({f.cpu_busy_wall:.1f} s wall) "
        f"| {f.cpu_busy * 1e3:.1f} ms | {f.cpu_busy / f.cpu_calls * 1e6:.2f} us |",
        f"| idle for the same {f.cpu_busy_wall:.1f} s | {f.cpu_idle * 1e3:.1f} ms | |",
        f"| making {f.cpu_calls:,} controller -> actor round trips itself "
        f"| {f.cpu_controller_calls * 1e3:.0f} ms "
        f"| {f.cpu_controller_calls / f.cpu_calls * 1e6:.0f} us |",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument(
        "--profile", action="store_true", help="also print a cProfile of the calling actor"
    )
    args = parser.parse_args(argv)
    figures = run(quick=args.quick, profile=args.profile)
    print(table(figures))
    if figures.profile:
        print("\ncProfile of the calling actor's main thread:\n")
        print(figures.profile)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
