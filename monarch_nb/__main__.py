"""``python -m monarch_nb demo``: the quick start, headless, in one command.

Starts a 4-rank mesh on this host, spawns actors, calls them every way there
is, shows live output, a remote error and a dead rank, and a gloo
all-reduce when torch is installed; then stops everything it started.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import sys
import time
import warnings
from typing import Any

from monarch_nb import (
    Actor,
    MeshFailure,
    RemoteError,
    __version__,
    current_rank,
    endpoint,
    this_host,
)


class Greeter(Actor):
    """A tiny actor: remembers a greeting, answers from every rank."""

    def __init__(self, greeting: str) -> None:
        self.greeting = greeting

    @endpoint
    def hello(self) -> str:
        rank = current_rank().rank
        print(f"{self.greeting} from rank {rank} (pid {os.getpid()})")
        return f"rank {rank} says {self.greeting}"

    @endpoint
    def square(self, x: int) -> int:
        return x * x

    @endpoint
    def divide(self, x: float) -> float:
        return 1 / x

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def nap(self, seconds: float) -> str:
        time.sleep(seconds)
        return "woke up"

    @endpoint
    def scale(self, tensor: Any, by: float) -> Any:
        return tensor * by

    @endpoint
    def all_reduce(self) -> list[float]:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        try:
            t = torch.full((2,), float(dist.get_rank()))
            dist.all_reduce(t)
            return t.tolist()
        finally:
            dist.destroy_process_group()


def demo(procs_per_host: int) -> None:
    step = _Steps()
    started = time.perf_counter()
    with this_host().spawn_procs(per_host={"procs": procs_per_host}, name="demo") as procs:
        step(f"started {procs} in {time.perf_counter() - started:.2f} s")
        greeters = procs.spawn("greeters", Greeter, "hello")

        step("call() every rank; their output streams back live, prefixed by rank")
        print(greeters.hello.call().get(timeout=30))

        step("call_one() on a slice, choose() one rank, stream() replies as they come")
        one = greeters.slice(procs=1).square.call_one(7).get(timeout=30)
        print(f"slice(procs=1).square.call_one(7) = {one}")
        print(f"square.choose(3) = {greeters.square.choose(3).get(timeout=30)}  (any one rank)")
        print("square.stream(5):")
        for point, value in greeters.square.stream(5):
            print(f"  {dict(point)} -> {value}")

        step("a remote error: one traceback, labelled with its rank set")
        try:
            greeters.divide.call(0).get(timeout=30)
        except RemoteError as error:
            print(error.render())

        if importlib.util.find_spec("torch") is not None:
            step("a 4 MiB tensor to every rank and back: its bytes travel beside the message")
            ones = _torch().ones(1024, 1024)
            print("scale.call(torch.ones(1024, 1024), 10):")
            for point, scaled in greeters.scale.call(ones, 10).get(timeout=60):
                print(f"  {dict(point)} -> shape {tuple(scaled.shape)}, sum {scaled.sum():.0f}")

            step("torch.distributed with no arguments: gloo all_reduce over every rank")
            print(f"all_reduce of [rank, rank] = {greeters.all_reduce.call().get(timeout=120)}")

        step("a rank dies: the call fails at once, naming it; restart() brings fresh ones")
        doomed = greeters.slice(procs=procs_per_host - 1)
        pid = doomed.pid.call_one().get(timeout=30)
        # A call still running when its rank dies, so the failure has someone to tell.
        pending = doomed.nap.call_one(120)
        os.kill(pid, signal.SIGKILL)
        try:
            pending.get(timeout=30)
        except MeshFailure as failure:
            print(f"MeshFailure: {failure}")
        procs.restart()
        greeters = procs.spawn("greeters", Greeter, "welcome back")
        print(f"square.call(2) after restart() = {greeters.square.call(2).get(timeout=30)}")
    step(f"stopped: {procs}")


def _torch() -> Any:
    """torch, imported only when the demo reaches its tensor steps.

    Without numpy (torch's CPU wheel installs none) ``import torch`` warns
    "Failed to initialize NumPy"; the demo needs no numpy, so it says nothing.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
        import torch
    return torch


DESCRIPTION = """\
A Jupyter-first, single-controller distributed environment for PyTorch.
"python -m monarch_nb" is the same command; "monarch-nb agent --help" shows the
agent's own options."""


DEBUG_DESCRIPTION = """\
Attach to the ranks of a script paused at breakpoint() whose stdin is not a
terminal (the script says so on stderr), as Monarch's `monarch debug` does.
The (Pdb rank N) prompt takes pdb commands for the attached rank and these:
ranks (which are paused, where), attach R, cast RANKS CMD (e.g. cast 0-3 p
loss), continue all, help. Ctrl-D detaches; the ranks stay paused."""


class _Steps:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self, text: str) -> None:
        self.n += 1
        print(f"\n== {self.n}. {text}", flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["agent"]:  # its own options, --help included
        from monarch_nb._agent._main import main as agent_main

        agent_main(argv[1:])
        return 0
    parser = argparse.ArgumentParser(
        prog="monarch-nb",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    run_demo = sub.add_parser("demo", help="run the quick start headless")
    run_demo.add_argument("--procs", type=int, default=4, help="ranks to start (default 4)")
    sub.add_parser(
        "agent",
        help="run this host's agent (for attach(): --listen tcp://0.0.0.0:PORT --key-file F)",
    )
    attach = sub.add_parser(
        "debug",
        help="attach this terminal to the ranks paused at breakpoint() in a script",
        description=DEBUG_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    attach.add_argument("--pid", type=int, default=None, help="the script's pid, if several")
    attach.add_argument(
        "--wait",
        type=float,
        default=None,
        metavar="S",
        help="give up after S seconds with no paused program (default: wait on)",
    )
    keygen = sub.add_parser("keygen", help="write a key file for attach() and agents")
    keygen.add_argument("path", help="where to write it (created readable by you only)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        demo(args.procs)
    elif args.command == "debug":
        from monarch_nb.debug._attach import run_client

        return run_client(args.pid, args.wait)
    elif args.command == "keygen":
        from monarch_nb._wire._keys import write_key_file

        try:
            write_key_file(args.path)
        except FileExistsError:
            parser.error(f"{args.path} exists; remove it first or choose another path")
        print(f"wrote {args.path}: give it to the agents (--key-file) and to attach(key_file=)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
