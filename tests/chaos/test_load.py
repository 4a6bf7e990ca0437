"""Load: many small calls and casts without controller memory growth; output floods
that neither stall the controller nor lose a line. (The benchmark runs the full
sizes: 1 million calls, 10,000 casts, 1e6 lines from 8 ranks.)"""

from __future__ import annotations

import gc
import threading
import time
from collections import Counter

import psutil
import pytest
from chaos_actors import Probe
from chaos_support import wait_until

from monarch_nb import this_host
from monarch_nb.events import Output

CALLS = 10_000
CASTS = 1_000
BATCH = 1_000
# A leak of one 500-byte object per call would show 5 MB here; allocator
# noise stays well below the limit.
RSS_GROWTH_LIMIT = 4 << 20


def rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def pipelined_calls(probe, n: int) -> int:
    """``n`` call_one round trips, ``BATCH`` in flight at a time; returns the sum."""
    total = 0
    for start in range(0, n, BATCH):
        futures = [probe.echo.call_one(i) for i in range(start, min(n, start + BATCH))]
        total += sum(f.get(timeout=30) for f in futures)
    return total


@pytest.fixture(scope="module")
def load_procs():
    procs = this_host().spawn_procs(per_host={"procs": 3}, name="load", echo_output=False)
    yield procs
    procs.stop()


@pytest.mark.slow
def test_many_calls_and_casts_do_not_grow_controller_memory(load_procs):
    one = load_procs.slice(procs=0).spawn("one", Probe)
    every = load_procs.spawn("every", Probe)
    # Warm up: caches, pools, allocator arenas, and the bounded histories at their
    # cap (the mesh's timeline keeps the newest calls).
    pipelined_calls(one, max(3 * BATCH, load_procs._group.timeline.max_events + BATCH))
    for i in range(BATCH):
        every.echo.broadcast(i)
    every.rank.call().get(timeout=30)
    # Three windows of the same work: a leak grows RSS in every one of them, while
    # the allocator taking a new arena (or the garbage collector running late) is
    # a step in one window only, so the smallest growth is the one that counts.
    growths = []
    for _ in range(3):
        before = rss()
        assert pipelined_calls(one, CALLS) == CALLS * (CALLS - 1) // 2
        for i in range(CASTS):
            every.echo.broadcast(i)
        # Calls to one actor run in order: this reply means every cast was handled.
        assert every.rank.call().get(timeout=30).values() == [0, 1, 2]
        growths.append(rss() - before)
    shown = ", ".join(f"{g / 2**20:.2f}" for g in growths)
    print(f"controller RSS growth over {CALLS} calls + {CASTS} casts, 3 windows: {shown} MiB")
    assert min(growths) < RSS_GROWTH_LIMIT, f"controller RSS grew {shown} MiB in each window"
    assert load_procs.busy_ranks() == []
    assert load_procs.state == "running"  # no cast failed


def test_an_output_flood_neither_stalls_the_controller_nor_loses_lines(load_procs):
    lines_per_rank = 20_000
    counts: Counter[int] = Counter()
    lock = threading.Lock()

    def count(event: Output) -> None:
        with lock:
            counts[event.rank] += 1

    probe = load_procs.spawn("flood", Probe)
    loud, quiet = probe.slice(procs=slice(0, 2)), probe.slice(procs=2)
    with load_procs.events.subscribe(count, kinds=(Output,)):
        flood = loud.flood.call(lines_per_rank)
        latencies = []
        while not flood.done():
            t0 = time.monotonic()
            assert quiet.rank.call_one().get(timeout=5) == 2
            latencies.append(time.monotonic() - t0)
        assert flood.get(timeout=30).values() == [lines_per_rank] * 2
        wait_until(lambda: counts[0] == counts[1] == lines_per_rank, 30, f"every line ({counts})")
    assert max(latencies) < 1.0, f"a call took {max(latencies):.3f} s during the flood"
    assert load_procs.output_tail(0)[-1].line == f"line {lines_per_rank - 1} of rank 0"
