"""Ranks forked from the zygote behave as fresh interpreters did, and none outlive
their controller: environment, working directory, output, exits, signals."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import psutil
import pytest
from process_checks import wait_for_exit

from monarch_nb import Actor, endpoint, this_host
from monarch_nb._model._errors import MeshFailure


class Rank(Actor):
    @endpoint
    def identity(self) -> dict:
        return {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "sid": os.getsid(0),
            "cwd": os.getcwd(),
            "argv": list(sys.argv),
            "path0": sys.path[0],
            "rank": os.environ.get("RANK"),
            "flag": os.environ.get("ZYGOTE_TEST_FLAG"),
            "random": random.random(),
            "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
        }

    @endpoint
    def say(self, text: str) -> None:
        print(text, flush=True)
        print(text, file=sys.stderr, flush=True)

    @endpoint
    def exit_with(self, code: int) -> None:
        sys.stdout.flush()
        os._exit(code)


@pytest.fixture(scope="module")
def forked(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    here = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    try:
        procs = this_host().spawn_procs(
            per_host={"procs": 3}, name="forked", env={"ZYGOTE_TEST_FLAG": "on"}
        )
    finally:
        os.chdir(here)
    yield procs
    procs.stop()


def _zygote_of(pid: int) -> psutil.Process:
    return psutil.Process(pid).parent()


def test_forked_ranks_see_what_a_fresh_rank_sees(forked):
    seen = forked.spawn("ids", Rank).identity.call().get(timeout=30).values()
    zygote = _zygote_of(seen[0]["pid"])
    # Children of one zygote, itself ours and started as any rank is.
    assert {s["ppid"] for s in seen} == {zygote.pid}
    assert zygote.ppid() == os.getpid()
    assert zygote.cmdline()[1:] == ["-m", "monarch_nb.worker"]
    # Told apart by its process name; its ranks have the interpreter's back.
    assert zygote.name() == "monarch_nb-zyg"
    assert {psutil.Process(s["pid"]).name() for s in seen} == {psutil.Process().name()}
    assert all(psutil.Process(s["pid"]).cmdline()[1:] == ["-m", "monarch_nb.worker"] for s in seen)
    # Each in a session of its own, with its own rank, the mesh's env and our cwd
    # (as of the start), argv and import path as `python -m monarch_nb.worker`.
    assert [s["sid"] for s in seen] == [s["pid"] for s in seen]
    assert [s["rank"] for s in seen] == ["0", "1", "2"]
    assert {s["flag"] for s in seen} == {"on"}
    assert len({s["cwd"] for s in seen}) == 1
    assert seen[0]["cwd"] != os.getcwd()
    assert {s["path0"] for s in seen} == {seen[0]["cwd"]}
    assert {s["argv"][0].endswith(os.path.join("monarch_nb", "worker.py")) for s in seen} == {True}
    # Reseeded after the fork: ranks do not draw the same numbers.
    assert len({s["random"] for s in seen}) == 3
    # No descriptor of the zygote's (its socket, its other children's pidfds) leaks
    # into a rank: a rank forked last has no more of them than the first.
    assert len(seen[2]["fds"]) <= len(seen[0]["fds"]) + 1


def test_forked_ranks_output_reaches_the_controller(forked):
    ranks = forked.spawn("say", Rank)
    ranks.say.call("zygote-hello").get(timeout=30)
    deadline = time.monotonic() + 30
    group = forked._group
    while time.monotonic() < deadline:
        lines = [
            (o.stream, o.line)
            for w in group.workers
            for o in w.output_tail
            if "zygote-hello" in o.line
        ]
        if len(lines) == 6:
            break
        time.sleep(0.05)
    assert sorted(lines) == [("stderr", "zygote-hello")] * 3 + [("stdout", "zygote-hello")] * 3


def test_a_forked_rank_exit_code_and_signal_are_reported(forked):
    ranks = forked.spawn("exits", Rank)
    with pytest.raises(MeshFailure, match=r"rank 2 \(pid \d+\) .*exited with code 3"):
        ranks.slice(procs=2).exit_with.call_one(3).get(timeout=30)
    victim = forked.pids[1]
    killed = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    deadline = killed + 30
    while 1 not in forked._group.dead and time.monotonic() < deadline:
        time.sleep(0.01)
    assert 1 in forked._group.dead
    # Within the bound of a fresh rank: its pidfd, not a heartbeat, tells.
    assert time.monotonic() - killed < 5.0
    with pytest.raises(MeshFailure, match=r"rank 1 \(pid \d+\) .*SIGKILL"):
        ranks.slice(procs=1).say.call_one("x").get(timeout=30)


def test_without_the_zygote_ranks_are_our_children():
    with this_host().spawn_procs(
        per_host={"procs": 2}, name="fresh", env={"MONARCH_NB_ZYGOTE": "0"}
    ) as procs:
        assert [psutil.Process(p).ppid() for p in procs.pids] == [os.getpid()] * 2


def test_the_zygote_exits_with_its_last_rank():
    with this_host().spawn_procs(
        per_host={"procs": 2}, name="alone", env={"MONARCH_NB_IDLE_RECHECK_MS": "999"}
    ) as procs:
        # An import-time setting of its own: a zygote of its own.
        zygote = _zygote_of(procs.pids[0])
        assert zygote.ppid() == os.getpid()
        assert json.loads(zygote.environ()["MONARCH_NB_IDLE_RECHECK_MS"]) == 999
    assert not wait_for_exit({zygote.pid}, 30)


_CONTROLLER = textwrap.dedent(
    """
    import json, psutil, time
    from monarch_nb import this_host
    procs = this_host().spawn_procs(per_host={"procs": 3})
    zygote = psutil.Process(procs.pids[0]).ppid()
    print(json.dumps([zygote, *procs.pids]), flush=True)
    time.sleep(120)
    """
)


def test_nothing_outlives_a_sigkilled_controller():
    controller = subprocess.Popen(
        [sys.executable, "-c", _CONTROLLER], stdout=subprocess.PIPE, text=True
    )
    try:
        assert controller.stdout is not None
        pids = set(json.loads(controller.stdout.readline()))
        assert len(pids) == 4  # the zygote and its three ranks
        controller.kill()
        controller.wait(30)
        left = wait_for_exit(pids, 30)
    finally:
        controller.kill()
        controller.wait(30)
        assert controller.stdout is not None
        controller.stdout.close()
    assert not left, f"left behind by a SIGKILLed controller: {sorted(left)}"
