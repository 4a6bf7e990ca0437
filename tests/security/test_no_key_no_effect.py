"""Attacks without the key, performed for real: none has an effect.

Each test is one finding of the red-team pass (issue "no key, no effect"): it
runs the attack (as another user of this machine where the finding is about
other users) and checks what must hold: the controller lives, the mesh keeps
answering, memory stays bounded, processes exit in time.
"""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
import zmq
from listening_agent import start_listening_agent
from process_checks import wait_for_exit

from monarch_nb import MeshUsageError, attach, ssh_hosts, this_host
from monarch_nb._controller._client import Controller
from monarch_nb._wire._rundir import run_dir

LOCAL_SSH = (sys.executable, "-c", "import os,sys; os.execvp('sh', ['sh', '-c', sys.argv[2]])")

_CONNECT_AS_OTHER_USER = textwrap.dedent(
    """
    import socket, sys
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(sys.argv[1])
        print("connected")
    except OSError as e:
        print(type(e).__name__)
    """
)


def test_another_user_cannot_reach_the_controller_or_claim_a_worker(attacker, procs2):
    # The controller's socket for local workers: a Unix socket in a 0700 directory.
    path = Controller.get().address.split("://", 1)[1]  # ipc://, or unixlink://
    out = attacker.run(_CONNECT_AS_OTHER_USER, path)
    assert out.stdout.strip() == "PermissionError", out
    # Worker ids are random: nothing about one generation predicts the next.
    before = {procs2._group.identity(r) for r in range(2)}
    procs2.restart()
    after = {procs2._group.identity(r) for r in range(2)}
    assert not before & after
    assert all(len(i) > 32 for i in after)
    assert procs2.run("rank").values() == [0, 1]


def test_a_predicted_agent_id_on_the_curve_endpoint_cannot_abort_the_controller():
    # The old predictable id, from a client that has no key: refused, controller alive.
    with ssh_hosts(["h0"], ssh=LOCAL_SSH, bind="127.0.0.1") as hosts:
        endpoint = hosts._agents.endpoint
        ctx = zmq.Context.instance()
        rogues = []
        for index in range(3):
            rogue = ctx.socket(zmq.DEALER)
            rogue.setsockopt(zmq.LINGER, 0)
            rogue.setsockopt(zmq.ROUTING_ID, f"agent-{hosts._agents.id}-{index}".encode())
            rogue.connect(endpoint)
            rogue.send(b"\0" * 64)
            rogues.append(rogue)
        try:
            with hosts.spawn_procs({"procs": 1}) as procs:
                assert procs.run("rank + 1").values() == [1]
        finally:
            for rogue in rogues:
                rogue.close(0)
        agent_id = hosts._agents.agents[0].identity.decode()
        assert agent_id.startswith("agent-")
        assert len(agent_id) > 38  # 128 random bits in it


def _agent_sockets() -> set[str]:
    return set(glob.glob(os.path.join(run_dir(), "agent-*")))


def test_an_agents_worker_socket_relays_nothing_from_strangers(attacker):
    before = _agent_sockets()
    with (
        ssh_hosts(["h0"], ssh=LOCAL_SSH, bind="127.0.0.1") as hosts,
        hosts.spawn_procs({"procs": 1}) as procs,
    ):
        (path,) = _agent_sockets() - before  # this agent's, in the tree's 0700 directory
        # Another user: cannot even connect.
        assert attacker.run(_CONNECT_AS_OTHER_USER, path).stdout.strip() == "PermissionError"
        # Our own uid, without a worker's id: 12 MB of frames, all dropped here.
        agent = psutil.Process(hosts._agents.agents[0].pid)
        rss_before = agent.memory_info().rss
        rogue = zmq.Context.instance().socket(zmq.DEALER)
        rogue.setsockopt(zmq.LINGER, 0)
        rogue.connect(f"ipc://{path}")
        try:
            for _ in range(12):
                rogue.send_multipart([b""] * 1024 + [bytes(1 << 20)])
            assert procs.run("rank").values() == [0]  # the mesh answers, not failed
        finally:
            rogue.close(0)
        assert procs.state == "running"
        assert agent.memory_info().rss - rss_before < 64 << 20


_PRE_AUTH_FLOOD = textwrap.dedent(
    """
    import socket, sys, time
    host, port, megabytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    conns = []
    for _ in range(2):
        s = socket.create_connection((host, port))
        # A ZMTP 3.0 greeting asking for CURVE, then one "handshake" frame that
        # claims to be huge, and its bytes: what libzmq would buffer before CURVE
        # could refuse the peer.
        greeting = b"\\xff" + bytes(8) + b"\\x7f" + bytes([3, 0]) + b"CURVE".ljust(20, b"\\0")
        s.sendall(greeting + b"\\0" + bytes(31))
        size = megabytes << 20
        s.sendall(b"\\x06" + size.to_bytes(8, "big"))
        chunk = bytes(1 << 20)
        try:
            for _ in range(megabytes):
                s.sendall(chunk)
        except OSError:
            pass  # refused: what we want
        conns.append(s)
    print("sent", flush=True)
    time.sleep(30)
    """
)


def test_memory_is_bounded_before_authentication_on_a_listening_agent(attacker, tmp_path):
    key_file = tmp_path / "agent.key"
    subprocess.run([sys.executable, "-m", "monarch_nb", "keygen", str(key_file)], check=True)
    agent, address = start_listening_agent(key_file, {"MONARCH_NB_MAX_FRAME_BYTES": str(1 << 20)})
    port = int(address.rpartition(":")[2])
    flood = None
    try:
        rss_before = psutil.Process(agent.pid).memory_info().rss
        flood = attacker.popen(_PRE_AUTH_FLOOD, "127.0.0.1", str(port), "256")
        assert flood.stdout is not None
        assert flood.stdout.readline().strip() == "sent"
        grown = psutil.Process(agent.pid).memory_info().rss - rss_before
        assert grown < 64 << 20, f"the agent took {grown >> 20} MiB from an unauthenticated peer"
        # And it still serves a controller with the key.
        hosts = attach([f"tcp://127.0.0.1:{port}"], key_file=str(key_file))
        with hosts.spawn_procs({"procs": 1}) as procs:
            assert procs.run("rank").values() == [0]
        hosts.shutdown()
    finally:
        if flood is not None:
            flood.kill()
            flood.communicate(timeout=30)
        agent.terminate()
        agent.wait(10)


_ATTACHED_CONTROLLER = textwrap.dedent(
    """
    import sys
    from monarch_nb import attach
    hosts = attach([sys.argv[1]], key_file=sys.argv[2], heartbeat_timeout=2.0)
    procs = hosts.spawn_procs({"procs": 2})
    print(*procs.pids, flush=True)
    import time
    time.sleep(600)
    """
)


@contextlib.contextmanager
def _agent_whose_controller_was_killed(tmp_path) -> Iterator[tuple[Any, str, Any, set[int]]]:
    """A listening agent whose attached controller (with 2 workers) was SIGKILLed:
    (agent, address, key file, the workers' pids). Both processes end after."""
    key_file = tmp_path / "agent.key"
    subprocess.run([sys.executable, "-m", "monarch_nb", "keygen", str(key_file)], check=True)
    agent, address = start_listening_agent(key_file)
    controller = None
    try:
        controller = subprocess.Popen(
            [sys.executable, "-c", _ATTACHED_CONTROLLER, address, str(key_file)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert controller.stdout is not None
        workers = {int(p) for p in controller.stdout.readline().split()}
        assert len(workers) == 2
        controller.send_signal(signal.SIGKILL)
        controller.wait(10)
        yield agent, address, key_file, workers
    finally:
        if controller is not None:
            if controller.poll() is None:
                controller.kill()
            controller.communicate(timeout=30)
        if agent.poll() is None:
            agent.kill()
            agent.wait(10)


def test_no_orphans_when_an_attached_controller_is_killed(tmp_path):
    with _agent_whose_controller_was_killed(tmp_path) as (agent, _, _, workers):
        # The agent hears nothing for its timeout, kills its workers, waits for the next.
        assert not wait_for_exit(workers, 60), "an attached agent's workers outlived the controller"
        assert agent.poll() is None
        started = time.monotonic()
        agent.terminate()
        agent.wait(30)
        assert time.monotonic() - started < 5, "the agent took too long to answer SIGTERM"


def test_a_typo_in_ranks_is_refused_before_it_is_expanded():
    from monarch_nb.magics._selection import parse_ranks

    started = time.monotonic()
    with pytest.raises(Exception, match=r"has ranks 0-3, not 99999999 \(nothing was expanded\)"):
        parse_ranks("0-99999999", 4)
    assert time.monotonic() - started < 1.0


def test_an_absurd_spawn_is_refused_with_a_clear_error():
    with pytest.raises(MeshUsageError, match="force=True"):
        this_host().spawn_procs(per_host={"procs": 100_000})


def test_a_new_controller_takes_over_an_agent_whose_controller_vanished(tmp_path):
    # Finding 7 / a reattach under load: the old controller never said goodbye
    # (killed, or its shutdown lost). The new one's messages used to be refused as
    # replays (its numbers start afresh) until the agent's silence check, and its
    # attach was lost for good: a hang. Now its numbers start above any earlier
    # session's, and the agent ends the old session (its workers) on a new attach.
    with _agent_whose_controller_was_killed(tmp_path) as (agent, address, key_file, old_workers):
        hosts = attach([address], key_file=str(key_file), timeout=60)
        try:
            assert not wait_for_exit(old_workers, 30), "the old session's workers live on"
            with hosts.spawn_procs({"procs": 1}) as procs:
                assert procs.run("rank").values() == [0]
        finally:
            hosts.shutdown()
        agent.terminate()
        agent.wait(10)
