"""Casts through a tree of host agents against the flat relay, many local agents.

Run: ``python benchmarks/bench_tree.py [--hosts 64] [--fanout 8] [--casts 400]``.

Every "host" is this machine ("ssh" runs the agent locally, as in
tests/test_multihost.py): ``--hosts`` agents, one single-process rank each, no
torch. The same host mesh is measured flat (``host_tree_fanout='0'``: the
controller sends one message per host) and as a tree (``--fanout`` per level),
alternating, in one run, so the baseline is beside each figure:

- **controller CPU per cast**: the caller thread's CPU time to send one endpoint
  cast to every rank (``broadcast()``: nothing waited for), over ``--casts``;
  and the whole process's (libzmq's I/O thread encrypts each send), less the
  one call that waits for the casts to be done;
- **controller CPU per cast + gather**: the whole controller process's CPU (all
  threads, libzmq's too) per ``call().get()`` to every rank; *per gather* is
  that minus the cast;
- **wall time per cast + gather**: the same calls, one after another;
- **the first root agent's CPU per cast + gather**: host 0's agent, which in the
  tree also relays to the hosts below it (the cost of one relaying agent);
- **call_one() to a rank on the last host**: wall time of a round trip to the
  deepest host, whose cast goes through one agent more in the tree (one hop);
- **one rank's failure**: a rank SIGKILLed while a call to every rank waits,
  to the call's MeshFailure naming it (the mesh restarted between; median of
  ``--kills``);
- **an intermediate agent's failure** (the tree only): an agent that relays to
  others SIGKILLed while a cast to a host below it waits in it, to the cast's
  MeshFailure naming the host.

The machine's 2 cores run the controller, every agent and every rank: the
wall times are an upper bound, the controller's CPU is what grows with hosts.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import threading
import time

import cloudpickle
import psutil

from monarch_nb import Actor, MeshFailure, config, endpoint, ssh_hosts

cloudpickle.register_pickle_by_value(sys.modules[__name__])

LOCAL_SSH = (sys.executable, "-c", "import os,sys; os.execvp('sh', ['sh', '-c', sys.argv[2]])")


class Noop(Actor):
    @endpoint
    def ping(self) -> int:
        return 0

    @endpoint
    def nap(self, seconds: float) -> str:
        time.sleep(seconds)
        return "slept"


def _process_cpu() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


def _measure(actors, casts: int, root_agent: int, deepest) -> dict[str, float]:
    actors.ping.call().get(timeout=120)  # warm: plans cached, links up
    # Casts alone: the caller thread's CPU for sending, and the whole process's
    # (libzmq's I/O thread encrypts what the caller queued), less one call's.
    p0, t0 = _process_cpu(), time.thread_time()
    for _ in range(casts):
        actors.ping.broadcast()
    cast_cpu = (time.thread_time() - t0) / casts
    actors.ping.call().get(timeout=300)  # the casts done everywhere
    with_barrier = _process_cpu() - p0
    time.sleep(0.5)
    # Cast + gather, one after another; and what the first subtree's root agent spent.
    agent = psutil.Process(root_agent)
    a0 = sum(agent.cpu_times()[:2])
    c0, w0 = _process_cpu(), time.perf_counter()
    for _ in range(casts):
        actors.ping.call().get(timeout=120)
    wall = (time.perf_counter() - w0) / casts
    total = (_process_cpu() - c0) / casts
    agent_cpu = (sum(agent.cpu_times()[:2]) - a0) / casts
    cast_process = max(0.0, with_barrier - total) / casts
    # One rank on the last host: its path is the deepest (one agent more than flat).
    one = deepest.ping
    one.call_one().get(timeout=60)
    w0 = time.perf_counter()
    for _ in range(casts):
        one.call_one().get(timeout=60)
    deep = (time.perf_counter() - w0) / casts
    return {
        "cast_cpu": cast_cpu,
        "cast_process": cast_process,
        "call_cpu": total,
        "gather_cpu": total - cast_cpu,
        "wall": wall,
        "agent_cpu": agent_cpu,
        "deep": deep,
    }


def _rank_failure(procs, actors) -> float:
    """Seconds from SIGKILLing the last rank to the waiting call's failure."""
    call = actors.nap.call(60)
    time.sleep(1.0)  # every rank in its nap
    victim = procs.pids[-1]
    os.kill(victim, signal.SIGKILL)
    started = time.perf_counter()
    try:
        call.get(timeout=60)
    except MeshFailure as exc:
        elapsed = time.perf_counter() - started
        if str(len(procs.pids) - 1) not in str(exc):
            raise AssertionError(f"the failure does not name the rank: {exc}") from exc
        return elapsed
    raise AssertionError("the call did not fail")


def _agent_failure(hosts, procs) -> tuple[float, str]:
    """Seconds from SIGKILLing an intermediate agent (stopped, so it holds the cast)
    to the failure of a cast to a host below it."""
    agents = hosts._agents
    roots = agents.tree.roots
    relay = next(r for r in roots if r.children)
    below = relay.children[-1].agent.index
    os.kill(relay.agent.pid, signal.SIGSTOP)
    call = procs.slice(hosts=below).exec("'reached'")
    os.kill(relay.agent.pid, signal.SIGKILL)
    started = time.perf_counter()
    try:
        call.get(timeout=60)
    except MeshFailure as exc:
        return time.perf_counter() - started, str(exc).splitlines()[0]
    raise AssertionError("the cast did not fail")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--fanout", default="8")
    parser.add_argument("--casts", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kills", type=int, default=3, help="rank kills per mode (median)")
    args = parser.parse_args()
    started = time.perf_counter()
    with config.configured(host_tree_fanout=args.fanout):
        hosts = ssh_hosts([f"h{i}" for i in range(args.hosts)], ssh=LOCAL_SSH, bind="127.0.0.1")
    try:
        tree = hosts._agents.tree
        sends = len(tree.roots or ())
        print(
            f"{args.hosts} agents up in {time.perf_counter() - started:.1f} s; tree "
            f"fan-out {args.fanout}: {sends} sends per cast, depth {tree.depth()}"
        )
        procs = hosts.spawn_procs({"procs": 1})
        actors = procs.spawn("noop", Noop)
        actors.ping.call().get(timeout=120)  # the spawn done: nothing in flight on a path
        print(f"{len(procs.pids)} ranks up after {time.perf_counter() - started:.1f} s")
        runs: dict[str, list[dict[str, float]]] = {"flat": [], "tree": []}
        for _ in range(args.rounds):
            for name, fanout in (("flat", "0"), ("tree", args.fanout)):
                tree.set_fanout(fanout)
                root = hosts._agents.agents[0].pid
                deepest = actors.slice(hosts=args.hosts - 1)
                runs[name].append(_measure(actors, args.casts, root, deepest))
        fails: dict[str, list[float]] = {"flat": [], "tree": []}
        for _ in range(args.kills):
            for name, fanout in (("flat", "0"), ("tree", args.fanout)):
                tree.set_fanout(fanout)
                fails[name].append(_rank_failure(procs, actors))
                procs.restart()
                actors = procs.spawn("noop", Noop)
                actors.ping.call().get(timeout=120)
        tree.set_fanout(args.fanout)
        agent_s, agent_error = _agent_failure(hosts, procs)
        procs.stop()
    finally:
        hosts.shutdown()

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    print(f"\n{args.hosts} hosts x 1 rank, median of {args.rounds} rounds of {args.casts} calls")
    print(f"| figure | flat ({args.hosts} sends) | tree ({sends} sends) | tree / flat |")
    print("|---|---:|---:|---:|")
    for key, label in (
        ("cast_cpu", "controller CPU per cast (caller thread)"),
        ("cast_process", "controller CPU per cast (process)"),
        ("gather_cpu", "controller CPU per gather (process)"),
        ("call_cpu", "controller CPU per cast + gather (process)"),
        ("wall", "wall time per cast + gather"),
        ("agent_cpu", "first root agent's CPU per cast + gather"),
        ("deep", "call_one() to a rank on the last host (wall)"),
    ):
        flat, tree_ = med("flat", key) * 1e6, med("tree", key) * 1e6
        print(f"| {label} | {flat:.0f} us | {tree_:.0f} us | {tree_ / flat:.2f}x |")
    flat_f = statistics.median(fails["flat"]) * 1e3
    tree_f = statistics.median(fails["tree"]) * 1e3
    print(
        f"| one rank SIGKILLed to the call's failure | {flat_f:.0f} ms | {tree_f:.0f} ms |"
        f" {tree_f / flat_f:.2f}x |"
    )
    print(
        f"| an intermediate agent SIGKILLed to the cast's failure | - | {agent_s * 1e3:.0f} ms"
        " | - |"
    )
    print(f"\nthe error: {agent_error}")


if __name__ == "__main__":
    threading.current_thread().name = "bench_tree"
    main()
