"""Two controllers, one listening agent: the newest wins cleanly, the old one is told.

A listening agent (``monarch-nb agent --listen``) serves the controller that
attached last. Before, with the old controller still connected, the agent dealt
its messages out between both, so the new attach timed out ("workers did not
start"), and an old controller that resumed took the host back. Now the new
controller's meshes work while the old one keeps sending, and the old one loses
the host with a message that says why. Real agent, real controllers (the second
in a process of its own: a controller is one per process).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from listening_agent import start_listening_agent
from polling import read_until

from monarch_nb import MeshFailure, attach
from monarch_nb._controller._client import Controller

pytestmark = pytest.mark.timeout(180)

# The second controller: attaches, runs on a mesh several times over a few
# heartbeats (the old controller sends meanwhile), prints what it got.
_SECOND = textwrap.dedent(
    """
    import sys, time
    from monarch_nb import attach
    hosts = attach([sys.argv[1]], key_file=sys.argv[2], timeout=60)
    print("attached", flush=True)
    with hosts.spawn_procs({"procs": 1}) as procs:
        answers = []
        until = time.monotonic() + 4.0  # several heartbeats of the old controller
        while time.monotonic() < until:
            answers.extend(procs.run("rank + 7", timeout=60).values())
        print("answers", set(answers), len(answers) > 3, flush=True)
    hosts.shutdown()
    """
)


def _key_file(tmp_path) -> str:
    path = str(tmp_path / "agent.key")
    subprocess.run([sys.executable, "-m", "monarch_nb", "keygen", path], check=True)
    return path


def _second_controller(address: str, key: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _SECOND, address, key],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _lost_why(procs) -> str:
    try:
        procs.run("rank", timeout=30)
    except MeshFailure as failure:
        return str(failure)
    return ""


def test_a_new_controller_takes_an_agent_while_the_old_one_is_connected(tmp_path):
    Controller.get()  # started before the agent, so attach() is not raced by it
    key = _key_file(tmp_path)
    agent, address = start_listening_agent(key)
    hosts = None
    try:
        hosts = attach([address], key_file=key)
        procs = hosts.spawn_procs({"procs": 1})
        assert procs.run("rank + 1", timeout=60).values() == [1]
        second = _second_controller(address, key)
        out, err = second.communicate(timeout=120)
        assert second.returncode == 0, err[-3000:]
        assert "answers {7} True" in out  # it ran, while this controller kept sending
        why = read_until(
            lambda: _lost_why(procs), bool, 60, "the old controller to learn it lost the host"
        )
        assert "another controller attached to its agent" in why
        assert agent.poll() is None  # the agent serves on: nobody broke it
    finally:
        if hosts is not None:
            hosts.shutdown()
        agent.terminate()
        agent.wait(10)


def test_a_stale_controller_that_resumes_does_not_take_the_host_back(tmp_path):
    key = _key_file(tmp_path)
    agent, address = start_listening_agent(key)
    # The old controller in a process of its own, paused (SIGSTOP) while the new
    # one attaches, then resumed while the new one runs.
    old = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                """
                import sys, time
                from monarch_nb import MeshFailure, attach
                hosts = attach([sys.argv[1]], key_file=sys.argv[2], timeout=60)
                procs = hosts.spawn_procs({"procs": 1})
                print("attached", flush=True)
                sys.stdin.readline()  # resumed: try to use the host again
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    try:
                        procs.run("rank", timeout=10)
                    except MeshFailure as failure:
                        print("lost:", failure, flush=True)
                        break
                    time.sleep(0.2)
                """
            ),
            address,
            key,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert old.stdout is not None
        assert old.stdin is not None
        assert old.stdout.readline().strip() == "attached"
        os.kill(old.pid, signal.SIGSTOP)
        second = _second_controller(address, key)
        assert second.stdout is not None
        assert second.stdout.readline().strip() == "attached"  # while the old one is paused
        os.kill(old.pid, signal.SIGCONT)
        old.stdin.write("go\n")
        old.stdin.flush()
        out, err = second.communicate(timeout=120)
        assert second.returncode == 0, err[-3000:]
        assert "answers {7} True" in out
        old_out, _ = old.communicate(timeout=90)
        assert "another controller attached to its agent" in old_out
    finally:
        for process in (old,):
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
                process.kill()
                process.wait(10)
        agent.terminate()
        agent.wait(10)
