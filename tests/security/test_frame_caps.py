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

import subprocess
import sys
import textwrap

import psutil
import pytest
from polling import wait_until

from monarch_nb import Actor, SerializationError, endpoint
from monarch_nb._common import _wire
from monarch_nb._common._wire import Receiver, WireStats
from monarch_nb._controller._client import Controller
from monarch_nb.config import configured

FRAMES = 500_000

_FLOOD = textwrap.dedent(
    """
    import os, sys, zmq
    address, frames = sys.argv[1], int(sys.argv[2])
    if address.startswith("unixlink://"):  # the controller's default link
        from monarch_nb._common._unix_link import LinkDealer
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
        push.send_multipart([b""] * (_wire.MAX_FRAMES_PER_MESSAGE + 5))
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
        assert takes > _wire.MAX_FRAMES_PER_MESSAGE // 1000  # never more than 1000 at a time
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
