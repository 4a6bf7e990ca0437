"""Monarch's side of a same-run comparison: run with an interpreter that has
``torchmonarch`` installed (its own virtualenv), driven over stdin/stdout.

It starts a one-process Monarch mesh with a no-op actor, then answers each
line ``sample N`` with one line of N round-trip latencies in seconds (``call_one``
of the no-op endpoint, each timed alone), and exits on ``quit`` or end of input.
``bench_tail.py --monarch-python PATH`` runs it beside monarch_nb and raw pyzmq,
in alternating blocks, so all three see the same load. No code of Monarch's is
copied here: it only calls Monarch's public API.
"""

from __future__ import annotations

import sys
import time

from monarch.actor import Actor, endpoint, this_host


class Noop(Actor):
    @endpoint
    def noop(self) -> None:
        return None


def main() -> None:
    procs = this_host().spawn_procs(per_host={"procs": 1})
    actor = procs.spawn("noop", Noop)
    actor.noop.call_one().get()
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        latencies = []
        for _ in range(int(words[1])):
            start = time.perf_counter()
            actor.noop.call_one().get()
            latencies.append(time.perf_counter() - start)
        print(" ".join(f"{t:.9f}" for t in latencies), flush=True)
    procs.stop().get()


if __name__ == "__main__":
    main()
