"""Finding 6: frames piled into one message cannot exhaust or stall the controller.

Another user cannot reach the controller's socket at all (a Unix socket in a
0700 directory: ``test_no_key_no_effect``); what is left is a process of our
own uid without the key (a stale worker of another kernel, a buggy tool). It
sends one message of half a million empty frames, 1 MB on the wire: the
controller used to build a Python object per frame while holding the lock every call
takes. Now it keeps at most ``max_message_frames`` of them, drops the message
(counted), and releases the lock every few thousand frames.
"""

from __future__ import annotations

import select
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from polling import wait_until

from monarch_nb import Actor, SerializationError, endpoint
from monarch_nb._controller._client import Controller
from monarch_nb._wire import _signed
from monarch_nb._wire._signed import Receiver, WireStats
from monarch_nb.config import configured

FRAMES = 500_000

_FLOOD = textwrap.dedent(
    """
    import os, sys, zmq
    address, frames = sys.argv[1], int(sys.argv[2])
    if address.startswith("unixlink://"):  # the controller's default link
        from monarch_nb._wire._unix_link import LinkDealer
        s = LinkDealer(address, os.urandom(16))
        s.send_parts([b""] * frames)
        s.close(60_000)  # returns once it is all written, or the controller hung up
    else:
        context = zmq.Context()
        s = context.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 60_000)
        s.connect(address)
        s.send_multipart([b""] * frames)
        s.close()
        context.term()  # returns once every frame is delivered (or after the linger)
    print("sent", flush=True)
    """
)


def test_a_message_of_millions_of_frames_is_dropped_without_holding_them(procs2):
    controller = Controller.get()
    assert procs2.run("rank").values() == [0, 1]
    dropped = controller.stats.dropped_oversized
    rss_before = psutil.Process().memory_info().rss
    flood = subprocess.run(
        [sys.executable, "-c", _FLOOD, controller.address, str(FRAMES)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert flood.stdout.strip() == "sent", flood.stderr
    wait_until(
        lambda: controller.stats.dropped_oversized == dropped + 1, 300, "the flood to be dropped"
    )
    # The mesh answers, and the controller never held the half million frames (as
    # Python objects they grew it by 119 MiB before the cap; 1 MiB with it).
    assert procs2.run("rank").values() == [0, 1]
    grown = psutil.Process().memory_info().rss - rss_before
    assert grown < 40 << 20, f"the controller grew by {grown >> 20} MiB"


def test_a_receiver_keeps_the_messages_around_a_dropped_one():
    import zmq

    context = zmq.Context.instance()
    pull, push = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    try:
        pull.bind("inproc://frame-caps")
        push.connect("inproc://frame-caps")
        push.send_multipart([b"before", b"1"])
        push.send_multipart([b""] * (_signed.MAX_FRAMES_PER_MESSAGE + 5))
        push.send_multipart([b"after"])
        stats = WireStats()
        receiver = Receiver(pull, stats)
        got: list[list[bytes]] = []
        takes = 0
        while True:
            messages, more = receiver.take(frames=1000)
            takes += 1
            got += [[f.bytes for f in m] for m in messages]
            if not more:
                break
        assert got == [[b"before", b"1"], [b"after"]]
        assert stats.dropped_oversized == 1
        assert takes > _signed.MAX_FRAMES_PER_MESSAGE // 1000  # never more than 1000 at a time
    finally:
        pull.close(0)
        push.close(0)


class ManyBuffers(Actor):
    @endpoint
    def chunks(self, n: int, ignored: object = None) -> list:
        return [bytes([i % 256]) * 5000 for i in range(n)]  # each its own out-of-band frame


def test_a_value_with_too_many_frames_is_refused_by_its_sender_and_says_why(procs2):
    with configured(max_message_frames=64):
        from monarch_nb import this_host

        procs = this_host().spawn_procs(per_host={"procs": 1})
        try:
            actor = procs.spawn("many", ManyBuffers)
            assert len(actor.chunks.call_one(10).get(timeout=60)) == 10
            with pytest.raises(SerializationError, match=r"one message carries at most 60"):
                actor.chunks.call_one(100).get(timeout=60)
            many = [bytes([i]) * 5000 for i in range(100)]
            with pytest.raises(SerializationError, match=r"arguments of ManyBuffers.chunks.*100"):
                actor.chunks.call_one(len(many), many).get(timeout=60)
            assert len(actor.chunks.call_one(10).get(timeout=60)) == 10  # it still answers
        finally:
            procs.stop()


# Pre-authentication memory, at the default settings (a 1 GiB frame cap): each
# connection sends a ZMTP greeting, then a frame header declaring a huge frame,
# then its bytes as fast as it can, which libzmq buffers until the frame is
# whole. 8 connections of 128 MiB each, peak RSS growth measured on a 2-core
# machine: before the guard's 64 KiB budget per unproven connection, a
# controller's CURVE endpoint grew by 1,024 MiB, a rank's inbox by 640 MiB, an
# agent by 1,024 MiB, a MONARCH_NB_BIND port by 1,024 MiB (224 MiB with frames
# declared at 8 GiB); with it by 13, 3, 8, 9 and 0 MiB.
ATTACKERS = 8
ATTACK_BYTES = 128 << 20  # per connection, unless it is cut first

_ATTACK = textwrap.dedent(
    """
    import socket, sys, threading
    port, mechanism, declared, send = sys.argv[1], sys.argv[2].encode(), *map(int, sys.argv[3:5])
    def one():
        s = socket.create_connection(("127.0.0.1", int(port)))
        greeting = b"\\xff" + bytes(8) + b"\\x7f" + bytes([3, 0]) + mechanism.ljust(20, b"\\0")
        s.sendall(greeting + bytes(32) + b"\\x06" + declared.to_bytes(8, "big"))
        chunk, sent = bytes(1 << 20), 0
        try:
            while sent < send:
                s.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass  # cut: what we want
        conns.append(s)
    conns = []
    threads = [threading.Thread(target=one) for _ in range(int(sys.argv[5]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("sent", flush=True)
    sys.stdin.read()
    """
)

# A controller with MONARCH_NB_BIND, its CURVE endpoint for agents, and a rank's
# inbox between hosts, in one process: prints their ports, lives until stdin closes.
_TARGETS = textwrap.dedent(
    """
    import os, sys, zmq
    os.environ["MONARCH_NB_BIND"] = "127.0.0.1"
    from monarch_nb._runtime._peer import PeerNode
    from monarch_nb._wire._signed import new_key
    from monarch_nb._controller._client import Controller
    controller = Controller()
    public, secret = zmq.curve_keypair()
    curve = controller.run(
        lambda: controller.bind_curve("127.0.0.1", public.decode(), secret.decode())
    )
    node = PeerNode(None, new_key(), tcp_host="127.0.0.1")
    ports = [a.rpartition(":")[2] for a in (controller.address, curve, node.tcp_address)]
    print(*ports, flush=True)
    sys.stdin.read()
    """
)


def _grown_under_attack(pid: int, port: int, mechanism: str, declared: int) -> int:
    """The most ``pid``'s RSS grew (bytes) while the attack ran and just after."""
    target = psutil.Process(pid)
    before = target.memory_info().rss
    attack = subprocess.Popen(
        [sys.executable, "-c", _ATTACK, str(port), mechanism, str(declared),
         str(ATTACK_BYTES), str(ATTACKERS)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    peak = before
    try:
        assert attack.stdout is not None
        deadline = time.monotonic() + 120
        # Sample the target's memory until the attacker says it sent all it could.
        while not select.select([attack.stdout], [], [], 0.005)[0]:
            peak = max(peak, target.memory_info().rss)
            assert time.monotonic() < deadline, "the attack did not finish"
        assert attack.stdout.readline().strip() == "sent"
        for _ in range(20):  # and what it holds just after
            peak = max(peak, target.memory_info().rss)
            time.sleep(0.01)
    finally:
        attack.kill()
        attack.communicate(timeout=30)
    return peak - before


@pytest.fixture(scope="module")
def targets():
    proc = subprocess.Popen(
        [sys.executable, "-c", _TARGETS], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        plain, curve, inbox = map(int, proc.stdout.readline().split())
        yield proc.pid, {"plain": plain, "curve": curve, "inbox": inbox}
    finally:
        proc.communicate("", timeout=60)


@pytest.mark.parametrize(
    ("endpoint", "mechanism", "declared"),
    [
        ("curve", "CURVE", (1 << 30) - 64),  # the controller's endpoint for agents
        ("inbox", "CURVE", (1 << 30) - 64),  # a rank's inbox between hosts
        ("plain", "NULL", (1 << 30) - 64),  # MONARCH_NB_BIND: within the frame cap
        ("plain", "NULL", 8 << 30),  # and past it: refused at the header
    ],
)
def test_a_keyless_peer_cannot_grow_an_endpoint_at_the_default_settings(
    targets, endpoint, mechanism, declared
):
    pid, ports = targets
    grown = _grown_under_attack(pid, ports[endpoint], mechanism, declared)
    assert grown < 64 << 20, f"{endpoint}: {grown >> 20} MiB from unauthenticated peers"


def test_a_keyless_peer_cannot_grow_a_listening_agent_at_the_default_settings(tmp_path):
    from listening_agent import start_listening_agent

    key_file = tmp_path / "agent.key"
    subprocess.run([sys.executable, "-m", "monarch_nb", "keygen", str(key_file)], check=True)
    agent, address = start_listening_agent(key_file)
    try:
        grown = _grown_under_attack(agent.pid, int(address.rpartition(":")[2]), "CURVE", 1 << 29)
        assert grown < 64 << 20, f"the agent took {grown >> 20} MiB from unauthenticated peers"
        assert agent.poll() is None
    finally:
        agent.terminate()
        agent.wait(30)
