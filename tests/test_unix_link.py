"""The controller's Unix link to local workers without libzmq (the default;
``MONARCH_NB_LINK=zmq`` is libzmq's ``ipc://`` socket).

The link stands in for the ROUTER/DEALER pair through :mod:`._sockets`: whole
messages in order, frames unchanged (large ones in a buffer of their own),
sends that never wait (what the kernel does not take queues and is written by
a flusher, so two sides sending big messages to each other finish), a
malformed stream ends only that connection, a caller's sends in a row are
held and written together when it waits (or soon after), and a mesh runs on
it end to end, as on libzmq.
"""

import os
import pickle
import random
import select
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from typing import Any

import pytest

from monarch_nb._wire import _link_connection, _signed, _sockets, _unix_link
from monarch_nb._wire._messages import Value
from monarch_nb._wire._signed import Receiver, WireStats
from monarch_nb._wire._unix_link import LinkDealer, LinkRouter, is_link


@pytest.fixture
def router(tmp_path):
    r = LinkRouter(str(tmp_path / "link"))
    yield r
    r.close()


def _stream_of(messages: list[list[bytes]]) -> bytes:
    out = b""
    for frames in messages:
        out += struct.pack(f"<I{len(frames)}Q", len(frames), *map(len, frames)) + b"".join(frames)
    return out


@pytest.mark.parametrize("in_c", [True, False], ids=["c", "python"])
def test_messages_come_out_whole_however_the_stream_is_cut(monkeypatch, in_c):
    """Random messages (empty frames, small ones, ones of 64 KiB and more), the
    stream cut at random places: the same messages come out, C parser or not."""
    if in_c and _link_connection._fastlink is None:
        pytest.skip("monarch_nb._wire._fastlink was not built")
    if not in_c:
        monkeypatch.setattr(_link_connection, "_fastlink", None)
    rng = random.Random(7)
    sizes = [0, 1, 57, 4096, (64 << 10) - 1, 64 << 10, 300_000]
    messages = [
        [rng.randbytes(rng.choice(sizes)) for _ in range(rng.randint(1, 5))] for _ in range(60)
    ]
    stream = _stream_of(messages)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    conn = _unix_link._Connection(ours, _unix_link._BufferPool())
    got: list[list] = []
    try:
        theirs.setblocking(False)
        at = 0
        deadline = time.monotonic() + 60
        while at < len(stream) or len(got) < len(messages):
            assert time.monotonic() < deadline, f"{len(got)} of {len(messages)} messages"
            if at < len(stream):
                cut = rng.choice([1, 3, 11, 4096, 70_000, 500_000])
                try:
                    at += theirs.send(stream[at : at + cut])
                except BlockingIOError:
                    pass
            conn.read(got)
        assert [[bytes(f) for f in m] for m in got] == messages
    finally:
        conn.close()
        theirs.close()


@pytest.fixture
def worker(router):
    """A connected worker end named ``w`` whose greeting the router has taken."""
    w = LinkDealer(router.address, b"w")
    _sockets.send_copied(w, [b"hello"])
    assert take_until(Receiver(router, WireStats()), 1) == [[b"w", b"hello"]]
    yield w
    w.close()


def take_until(receiver: Receiver, count: int, timeout: float = 30.0) -> list[list]:
    """``count`` whole messages, polling the link's fd as the wire does."""
    got: list[list] = []
    deadline = time.monotonic() + timeout
    poller = select.poll()
    poller.register(receiver.socket.fileno(), select.POLLIN)
    while len(got) < count:
        assert time.monotonic() < deadline, f"only {len(got)} of {count} messages came"
        done, more = receiver.take()
        got.extend(done)
        if not more and len(got) < count:
            poller.poll(100)
    return got


def test_messages_go_both_ways_whole_in_order_and_to_the_named_identity(router):
    a = LinkDealer(router.address, b"rank-a")
    b = LinkDealer(router.address, b"rank-b")
    try:
        assert is_link(router)
        assert is_link(a)
        for i in range(200):
            _sockets.send_copied(a, [b"a", str(i).encode()])
        _sockets.send_copied(b, [b"b", b""])
        got = take_until(Receiver(router, WireStats()), 201)
        from_a = [bytes(m[2]) for m in got if m[0].bytes == b"rank-a"]
        assert from_a == [str(i).encode() for i in range(200)]
        assert [m for m in got if m[0].bytes == b"rank-b"] == [[b"rank-b", b"b", b""]]
        # A ROUTER's sends: the first part names the connection; a cast to several.
        _sockets.send_copied(router, [b"rank-b", b"only", b"b"])
        _sockets.send_each_copied(router, [b"rank-a", b"rank-b"], b"cast")
        _sockets.send_copied(router, [b"nobody", b"dropped"])  # as a ROUTER drops it
        assert take_until(Receiver(b, WireStats()), 2) == [[b"only", b"b"], [b"cast"]]
        assert take_until(Receiver(a, WireStats()), 1) == [[b"cast"]]
        assert _sockets.socket_events(a) & 1 == 0
    finally:
        a.close()
        b.close()


def test_messages_written_behind_wait_for_the_flush_in_order(router, worker, monkeypatch):
    """While ``write_behind`` is set, a worker's messages wait (per worker, in
    order) until ``flush_behind()``; a later message to that worker queues behind
    them even with the flag off; a worker with nothing waiting gets its own at once."""
    monkeypatch.setattr(_unix_link, "_WRITE_BEHIND_S", 60.0)  # no timer in this test
    other = LinkDealer(router.address, b"v")
    try:
        _sockets.send_copied(other, [b"hi"])
        assert take_until(Receiver(router, WireStats()), 1) == [[b"v", b"hi"]]
        router.write_behind = True
        for i in range(5):
            _sockets.send_copied(router, [b"w", str(i).encode()])
        router.write_behind = False
        _sockets.send_copied(router, [b"w", b"after"])
        _sockets.send_copied(router, [b"v", b"direct"])
        assert take_until(Receiver(other, WireStats()), 1) == [[b"direct"]]
        poller = select.poll()
        poller.register(worker.fileno(), select.POLLIN)
        assert poller.poll(0) == [], "a message written behind went before the flush"
        router.flush_behind()
        got = take_until(Receiver(worker, WireStats()), 6)
        assert got == [[str(i).encode()] for i in range(5)] + [[b"after"]]
        _sockets.send_copied(router, [b"w", b"now"])  # nothing waits: at once
        assert take_until(Receiver(worker, WireStats()), 1, timeout=5) == [[b"now"]]
        # A worker's full batch goes at once, flag or not: a pipelining caller's
        # thousands of calls flow in batches, not one timer apart.
        router.write_behind = True
        batch = _unix_link._BEHIND_BATCH
        for i in range(batch + 1):
            _sockets.send_copied(router, [b"w", str(i).encode()])
        router.write_behind = False
        got = take_until(Receiver(worker, WireStats()), batch, timeout=5)
        assert got == [[str(i).encode()] for i in range(batch)]
        assert router._behind[worker_conn(router, b"w")] == [[str(batch).encode()]]
        router.flush_behind()
    finally:
        other.close()


def worker_conn(router: LinkRouter, identity: bytes):
    return router._by_identity[identity]


def test_what_waits_behind_goes_by_itself_soon_after(router, worker):
    """A caller that never waits (fire and forget): the link's timer writes it."""
    router.write_behind = True
    _sockets.send_each_copied(router, [b"w"], b"one")
    _sockets.send_copied(router, [b"w", b"two"])
    router.write_behind = False
    assert take_until(Receiver(worker, WireStats()), 2) == [[b"one"], [b"two"]]


def test_a_message_over_the_wires_frame_cap_ends_its_connection(router, worker):
    """A message over the receiver's frame cap ends that connection and is
    counted; the cap is the wire's (``MONARCH_NB_MAX_MESSAGE_FRAMES``)."""
    for _ in range(3):
        _sockets.send_copied(worker, [b"x"] * 3)
    got: list = []
    deadline = time.monotonic() + 30
    poller = select.poll()
    poller.register(router.fileno(), select.POLLIN)
    while len(got) < 3:
        assert time.monotonic() < deadline
        done, _ = router.take(100, 100, max_frames=3)
        got.extend(done)
        if len(got) < 3:
            poller.poll(100)
    assert got == [[b"w", b"x", b"x", b"x"]] * 3
    _sockets.send_copied(worker, [b"x"] * 4)
    while b"w" in router._by_identity:
        assert time.monotonic() < deadline, "a message over the cap was taken"
        assert router.take(100, 100, max_frames=3) == ([], False)
        poller.poll(100)
    assert router.take_dropped() == 1  # counted, as zmq's receiver counts what it drops
    assert router.take_dropped() == 0


def test_the_wires_receiver_counts_what_a_link_drops_over_its_cap(monkeypatch, router, worker):
    """The wire's receiver asks a link directly (no C wrapper between): what the
    link drops over the wire's frame cap still reaches the wire's counters."""
    monkeypatch.setattr(_signed, "MAX_FRAMES_PER_MESSAGE", 3)
    stats = WireStats()
    receiver = Receiver(router, stats)
    _sockets.send_copied(worker, [b"x"] * 3)
    assert take_until(receiver, 1) == [[b"w", b"x", b"x", b"x"]]
    _sockets.send_copied(worker, [b"x"] * 4)
    poller = select.poll()
    poller.register(router.fileno(), select.POLLIN)
    deadline = time.monotonic() + 30
    while stats.dropped_oversized == 0:
        assert time.monotonic() < deadline, "the message over the cap was never counted"
        assert receiver.take() == ([], False)
        poller.poll(100)
    assert stats.dropped_oversized == 1


@pytest.mark.parametrize("in_c", [True, False], ids=["c", "python"])
def test_a_message_of_more_frames_than_one_write_takes_arrives_whole(
    router, worker, monkeypatch, in_c
):
    """3,000 frames (a list of tensors each in a frame of its own): more buffers
    than one ``sendmsg`` takes, so the rest goes after; both ways, C or not."""
    if not in_c:
        monkeypatch.setattr(_link_connection, "_fastlink", None)
    frames = [str(i).encode() * (i % 7) for i in range(3000)]
    _sockets.send_copied(worker, frames)
    assert take_until(Receiver(router, WireStats()), 1) == [[b"w", *frames]]
    router.write_behind = True  # and several such messages in one write
    for _ in range(2):
        _sockets.send_copied(router, [b"w", *frames])
    router.write_behind = False
    router.flush_behind()
    assert take_until(Receiver(worker, WireStats()), 2) == [frames, frames]


@pytest.mark.parametrize("in_c", [True, False], ids=["c", "python"])
def test_a_batch_the_kernel_takes_in_part_arrives_whole_as_it_was_sent(
    router, worker, monkeypatch, in_c
):
    """Messages held behind go in one write (in C, else in Python); what the
    socket's buffer does not take arrives after, in order, and a frame of the
    caller's own memory arrives as it was at the send, changed or not since."""
    if not in_c:
        monkeypatch.setattr(_link_connection, "_fastlink", None)
    monkeypatch.setattr(_unix_link, "_WRITE_BEHIND_S", 60.0)  # no timer in this test
    held = [os.urandom(2 << 20) for _ in range(3)]
    mine = bytearray(os.urandom(2 << 20))  # 8 MiB in all: twice the socket's buffer
    sent_as = bytes(mine)
    router.write_behind = True
    for frame in held:
        _sockets.send_copied(router, [b"w", b"", frame])  # bytes: held
    assert len(router._behind[worker_conn(router, b"w")]) == 3
    router.send(b"w", 2)  # zmq.SNDMORE
    router.send(mine, 0, copy=False)  # the caller's memory: all four go now
    router.write_behind = False
    assert not router._behind
    mine[:] = bytes(len(mine))
    got = take_until(Receiver(worker, WireStats()), 4)
    assert got == [[b"", frame] for frame in held] + [[sent_as]]


def test_a_batch_written_as_the_reader_finds_the_peer_gone_leaves_it_gone(
    router, worker, monkeypatch
):
    """The reader marks a connection ended without the send lock; a batch write
    that succeeds meanwhile must not mark it alive again (it would stay in use)."""
    fastlink = _link_connection._fastlink
    if fastlink is None:
        pytest.skip("monarch_nb._wire._fastlink was not built")
    conn = worker_conn(router, b"w")

    def send_many_as_the_reader_ends_it(fd, messages):
        conn.eof = True  # what the I/O thread's read does on EOF, unlocked
        return fastlink.send_many(fd, messages)

    monkeypatch.setattr(
        _link_connection,
        "_fastlink",
        type("FastLink", (), {"send_many": staticmethod(send_many_as_the_reader_ends_it)}),
    )
    assert conn.send_many([[b"x"], [b"y"]]) is False
    assert conn.eof


def test_the_c_batch_write_declines_what_it_does_not_take(router, worker):
    """``send_many`` in C leaves to Python what is not a list of lists of at
    most 16 buffers each, and more buffers than one write takes."""
    fastlink = _link_connection._fastlink
    if fastlink is None:
        pytest.skip("monarch_nb._wire._fastlink was not built")
    fd = worker_conn(router, b"w").fd
    assert fastlink.send_many(fd, [(b"a",)]) is None
    assert fastlink.send_many(fd, [[]]) is None
    assert fastlink.send_many(fd, [[b"x"] * 17]) is None
    assert fastlink.send_many(fd, [[b"x"] * 16] * 61) is None  # 1,037 buffers
    assert fastlink.send_many(fd, [[b"a"], ["not a buffer"]]) is None
    assert fastlink.send_many(fd, []) is None
    assert fastlink.send_many(fd, [[b"a", b""], [b"bc"]]) == 0
    assert take_until(Receiver(worker, WireStats()), 2) == [[b"a", b""], [b"bc"]]


def test_large_frames_arrive_unchanged_in_writable_buffers_of_their_own(router, worker):
    payload = os.urandom(3 << 20) + bytes(5 << 20)
    router.send(b"w", 2)  # zmq.SNDMORE
    router.send(memoryview(payload), 2, copy=False)
    router.send(b"tail", 0)
    (message,) = take_until(Receiver(worker, WireStats()), 1)
    assert [len(f) for f in message] == [len(payload), 4]
    assert message[0] == payload
    assert message[1] == b"tail"
    assert not memoryview(message[0]).readonly  # as zmq's frames: torch can wrap it


def test_a_frames_buffer_is_used_again_only_once_nobody_holds_it(router, worker):
    """Buffers of large frames are pooled (no fresh pages per message): one that a
    view, a tensor or the frame itself still holds is never written again."""

    def one_frame(fill: int) -> bytearray:
        router.send(b"w", 2)
        router.send(bytes([fill]) * (1 << 20), 0)
        (message,) = take_until(Receiver(worker, WireStats()), 1)
        return message[0]

    first = one_frame(1)
    held = memoryview(first)[:4]  # as a tensor made from the frame would hold it
    first_ref = weakref.ref(first)
    del first
    second = one_frame(2)
    assert second is not first_ref()
    assert bytes(held) == b"\x01" * 4
    del held
    third = one_frame(3)
    assert third is first_ref()  # free now: the pool kept it, and used it again
    assert bytes(third) == b"\x03" * (1 << 20)
    assert bytes(second[:4]) == b"\x02" * 4


def test_two_sides_sending_big_messages_to_each_other_both_finish(router, worker):
    """Neither side reads while it sends: without the flusher's queue, both would
    block on a full socket buffer (a deadlock)."""
    big = bytes(range(256)) * (64 << 12)  # 64 MiB
    started = time.monotonic()
    for _ in range(3):
        router.send(b"w", 2)
        router.send(big, 0, copy=False)
        worker.send(big, 0, copy=False)
    assert time.monotonic() - started < 30, "a send waited for the reader"
    box: list = []
    reader = threading.Thread(
        target=lambda: box.append(take_until(Receiver(worker, WireStats()), 3))
    )
    reader.start()
    to_router = take_until(Receiver(router, WireStats()), 3, timeout=120)
    reader.join(120)
    assert [bytes(m[1]) == big for m in to_router] == [True] * 3
    assert [bytes(m[0]) == big for m in box[0]] == [True] * 3


def test_a_closing_worker_still_sends_what_queues(router, worker):
    """As a zmq socket with LINGER: a rank's last large message is not lost when it
    closes its end right after sending."""
    big = os.urandom(1 << 20) * 24  # more than a socket buffer holds
    worker.send(big, 0, copy=False)
    closing = threading.Thread(target=worker.close)  # returns once all is sent
    closing.start()
    (message,) = take_until(Receiver(router, WireStats()), 1)
    closing.join(30)
    assert bytes(message[1]) == big


def test_a_socket_closing_as_its_flusher_ends_touches_no_closed_descriptor(monkeypatch):
    """The flusher's thread may see the close flag (it reads it unlocked, on each
    turn) before close() has written its wake-up: the pipe must still be open
    then, or the wake-up fails (EBADF), or writes into a file that took its
    number. A timer that sets itself again keeps the thread turning."""
    failures: list = []
    monkeypatch.setattr(threading, "excepthook", failures.append)
    write = os.write

    def slow_write(fd: int, data: bytes) -> int:  # widens the gap between the two
        time.sleep(0.001)
        return write(fd, data)

    monkeypatch.setattr(_unix_link.os, "write", slow_write)
    _close_flushers_as_they_turn(200)
    assert failures == []


def _close_flushers_as_they_turn(times: int) -> None:
    for _ in range(times):
        flusher = _unix_link._Flusher("test-flush")

        def again(flusher=flusher) -> None:  # keeps the thread turning
            flusher.later(0.0, again)

        again()
        flusher.close()
        flusher.close()  # a second close (two threads closing the socket) is harmless
        flusher._thread.join(30)
        assert not flusher._thread.is_alive()


@pytest.mark.parametrize(
    "garbage",
    [
        # named, then more frames than any message has
        struct.pack("<IQ", 1, 3) + b"bad" + struct.pack("<I", 0xFFFFFFFF),
        # a message of no frames
        struct.pack("<IQ", 1, 3) + b"bad" + struct.pack("<I", 0),
        # a 100 MiB frame before naming itself: nothing is allocated for it
        struct.pack("<IQ", 1, 100 << 20) + b"x" * 1024,
        # a greeting of two frames
        struct.pack("<IQQ", 2, 1, 1) + b"ab",
        # a "name" longer than any, then a 100 MiB frame in the same read
        struct.pack("<IQ", 1, 300) + b"n" * 300 + struct.pack("<IQ", 1, 100 << 20) + b"x" * 1024,
    ],
    ids=[
        "too-many-frames",
        "no-frames",
        "big-before-name",
        "two-frame-greeting",
        "big-after-no-name",
    ],
)
def test_a_malformed_stream_ends_that_connection_only(router, garbage):
    good = LinkDealer(router.address, b"good")
    bad = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        bad.connect(router.path)
        bad.sendall(garbage)
        _sockets.send_copied(good, [b"fine"])
        got = take_until(Receiver(router, WireStats()), 1)
        assert got == [[b"good", b"fine"]]
        deadline = time.monotonic() + 30
        bad.settimeout(30)
        while bad.recv(1) != b"":
            assert time.monotonic() < deadline
        _sockets.send_copied(router, [b"good", b"still"])
        assert take_until(Receiver(good, WireStats()), 1) == [[b"still"]]
    finally:
        bad.close()
        good.close()


def test_a_burst_is_parsed_a_bounded_batch_at_a_time_and_none_is_left_unannounced(router, worker):
    """A burst far larger than one read parses: each read parses a few hundred
    messages (each a list the garbage collector tracks; thousands at once were
    promoted to its oldest generation) and keeps the rest in its buffer, where
    the fd does not announce them: the socket's take and events must, both ways."""
    limit = _unix_link._READ_MESSAGES
    count = 5 * limit + 7

    def take_all(receiver: Receiver, sock: Any) -> list[list]:
        # What one read parsed, all of it: nothing parsed waits, the kernel holds
        # nothing more (the read took it all into the buffer), yet more waits.
        got, more = receiver.take(frames=1 << 20, messages=count)
        assert len(got) == limit
        assert more
        assert not sock._ready
        assert select.select([sock.fileno()], [], [], 0)[0] == []
        assert _sockets.socket_events(sock) & 1
        while more:  # no poll: take() says when it has all
            done, more = receiver.take(frames=1 << 20, messages=count)
            got += done
        assert not _sockets.socket_events(sock) & 1
        return got

    burst = [[b"m", str(i).encode()] for i in range(count)]
    worker._conn.send_many(burst)
    worker._conn.drain(30_000)  # all of it in the kernel before the router reads
    assert not worker._conn.backlog
    got = take_all(Receiver(router, WireStats()), router)
    assert [[m[0].bytes, *m[1:]] for m in got] == [[b"w", *frames] for frames in burst]

    for i in range(count):  # and to the worker
        _sockets.send_copied(router, [b"w", str(i).encode()])
    deadline = time.monotonic() + 30
    while worker_conn(router, b"w").backlog:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert take_all(Receiver(worker, WireStats()), worker) == [
        [str(i).encode()] for i in range(count)
    ]


def test_a_workers_take_keeps_to_its_frame_budget_and_the_order(router, worker):
    """A worker's take reads straight into the list it returns: past the frame
    budget, what it read waits for the next take, in order, as on the router."""
    messages = [[str(i).encode(), b"a", b"b"] for i in range(12)]  # 3 frames each
    for frames in messages:
        _sockets.send_copied(router, [b"w", *frames])
    deadline = time.monotonic() + 30
    while worker_conn(router, b"w").backlog:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    receiver = Receiver(worker, WireStats())
    got: list[list] = []
    while len(got) < len(messages):
        assert time.monotonic() < deadline, f"only {len(got)} messages came"
        done, _ = receiver.take(frames=5, messages=10)
        assert 1 <= len(done) <= 2 or not done  # 3 + 3 frames pass a budget of 5: two at most
        got += done
        if not done:
            select.select([worker.fileno()], [], [], 0.1)
    assert got == messages


def test_a_large_frame_read_with_the_name_before_it_arrives_whole(router):
    """A worker's first message after its name may carry a large frame, and the
    router may read both at once: the name, taken once the read returns, is
    not known yet, but it came first (it broke the connection)."""
    worker = LinkDealer(router.address, b"w")  # its name, written at once
    big = b"b" * (1 << 20)
    try:
        _sockets.send_copied(worker, [b"hello", big])
        (message,) = take_until(Receiver(router, WireStats()), 1)
        assert [bytes(frame) for frame in message] == [b"w", b"hello", big]
    finally:
        worker.close()


def test_a_worker_whose_controller_is_gone_is_not_woken_forever(router, worker):
    """End-of-file would make the fd readable for good; the wire thread polls it."""
    router.close()
    poller = select.poll()
    poller.register(worker.fileno(), select.POLLIN)
    deadline = time.monotonic() + 30
    while poller.poll(100):
        assert time.monotonic() < deadline, "the fd stays readable after end-of-file"
        assert Receiver(worker, WireStats()).take() == ([], False)
    assert poller.poll(200) == []


@pytest.mark.parametrize("link", ["unix", "zmq"])
def test_a_mesh_runs_on_either_link_end_to_end(link):
    """Calls, a cast, a 64 MiB argument each way, a rank's failure, calls sent
    in a row before a wait and calls fired and forgotten: the same on the Unix
    link (the default) and on libzmq (``MONARCH_NB_LINK=zmq``); and on the link,
    keyless processes of our uid cannot confuse it."""
    script = textwrap.dedent(
        """
        import os, select, sys, tempfile, time
        import torch
        from monarch_nb import Actor, endpoint, this_host
        from monarch_nb._controller._client import Controller

        class Echo(Actor):
            @endpoint
            def echo(self, x):
                return x

            @endpoint
            def fail(self):
                raise ValueError("on purpose")

            @endpoint
            def touch(self, path):
                open(f"{path}-{os.getpid()}", "w").close()

        class Holder(Actor):
            def __init__(self):
                self.w = torch.zeros(6 << 20)

            @endpoint
            def weights(self):
                return self.w

            @endpoint
            def step(self):
                self.w.add_(1.0)

            @endpoint
            def reset(self):
                self.w.zero_()

        link = sys.argv[1]
        deadline = time.monotonic() + 120
        with this_host().spawn_procs(per_host={"procs": 2}, name="link") as procs:
            kind = type(Controller.get().router).__name__
            assert kind == {"unix": "LinkRouter", "zmq": "Socket"}[link], kind
            echo = procs.spawn("echo", Echo)
            assert list(echo.echo.call(7).get().values()) == [7, 7]
            big = bytes(range(256)) * (1 << 18)
            assert echo.slice(procs=1).echo.call_one(big).get() == big
            t = torch.arange(1 << 20, dtype=torch.float32)
            assert torch.equal(echo.slice(procs=0).echo.call_one(t).get(), t)
            try:
                echo.fail.call().get()
            except Exception as exc:
                assert "on purpose" in str(exc), exc
            else:
                raise AssertionError("a rank's failure was not raised")

            # Several calls before a wait (on the link all but the first wait
            # behind until the get()): replies in order, each to its call.
            other = procs.spawn("other", Echo)
            meshes = [echo, other, echo, other, echo]
            futures = [m.echo.call(i) for i, m in enumerate(meshes)]
            assert [list(f.get().values()) for f in futures] == [[i, i] for i in range(5)]
            if link == "unix":
                # After a burst the caller's next first send waits behind too,
                # until its wait; after a lone call, a lone call goes at once.
                from monarch_nb._wire import _unix_link
                router, timer = Controller.get().router, _unix_link._WRITE_BEHIND_S
                _unix_link._WRITE_BEHIND_S = 600.0  # no timer here
                future = echo.echo.call(1)
                assert router._behind, "a bursting caller's first send went at once"
                assert list(future.get().values()) == [1, 1]
                future = echo.echo.call(2)
                assert not router._behind, "a lone call waited behind"
                assert list(future.get().values()) == [2, 2]
                _unix_link._WRITE_BEHIND_S = timer
            # A tensor sent in a row and changed at once, 1 MiB (which the
            # link's kernel buffer takes at once) and 24 MiB (which no socket
            # does): what was sent is what it held at the call.
            for numel in (1 << 18, 6 << 20):
                t = torch.zeros(numel)
                futures = [echo.echo.call(0), echo.slice(procs=0).echo.call_one(t)]
                t.fill_(1.0)
                assert torch.equal(futures[1].get(), torch.zeros(numel)), numel
            # And a rank's reply: the weights it returned, updated in place by
            # its next endpoint while the reply is still being sent.
            holder = procs.spawn("holder", Holder).slice(procs=0)
            for _ in range(3):
                weights, _ = holder.weights.call_one(), holder.step.call_one()
                assert torch.equal(weights.get(), torch.zeros(6 << 20))
                holder.reset.call_one().get()
            # Fired and forgotten, never waited for: they still arrive (on the
            # link, its timer writes them).
            where = tempfile.mkdtemp()
            for name in ("a", "b", "c"):
                other.touch.broadcast(os.path.join(where, name))
            while len(os.listdir(where)) < 6:
                assert time.monotonic() < deadline, os.listdir(where)
                time.sleep(0.02)

            if link == "unix":
                # Keyless processes of our uid: a stranger's frames are dropped
                # unread and counted; one claiming a live rank's name is hung up
                # on, and the rank keeps its link.
                from monarch_nb._wire._unix_link import LinkDealer
                address = Controller.get().address
                before = procs.status().wire.dropped_unknown_peer
                stranger = LinkDealer(address, os.urandom(16).hex().encode())
                for i in range(50):
                    stranger.send_parts([os.urandom(57 + i), b"x" * i])
                impostor = LinkDealer(address, procs._group.identity(0))
                impostor.send_parts([os.urandom(100)])
                poller = select.poll()
                poller.register(impostor.fileno(), select.POLLIN)
                while impostor.take(10, 10) == ([], False) and not impostor._conn.eof:
                    assert time.monotonic() < deadline, "the impostor was not hung up on"
                    poller.poll(100)
                while procs.status().wire.dropped_unknown_peer - before < 50:
                    assert time.monotonic() < deadline, "the stranger's frames were not counted"
                    time.sleep(0.05)
                assert list(echo.echo.call(8).get().values()) == [8, 8]
                stranger.close()
                impostor.close()
        print("link ok")
        """
    )
    env = dict(os.environ, MONARCH_NB_LINK=link)
    done = subprocess.run(
        [sys.executable, "-c", script, link], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "link ok" in done.stdout


def test_a_reply_sealed_and_written_in_one_step_is_the_frame_sealed_in_steps_in_order(
    router, worker
):
    """A rank's reply (``LinkDealer.send_small``: pickled, sealed and written in one
    C step) arrives as the frame ``Signer.seal_small`` gives for the same number:
    written at once, or queued behind a message the kernel took in part, in
    order; one too big for a step sends nothing and uses up no number."""
    key = _signed.new_key()
    tag = _signed.sender_tag(b"w")

    def rank_signer() -> _signed.Signer:
        return _signed.Signer(key, WireStats(), sender=tag, upstream=True, trusted_link=True)

    one_step, in_steps = rank_signer(), rank_signer()
    payload = pickle.dumps(("ok", 7), protocol=5)
    events = worker.send_small(one_step, (Value.TAG, 1), payload)
    assert events is not None
    assert events & 1 == 0  # nothing came in meanwhile
    big = os.urandom(8 << 20)  # twice the socket's buffer: the flusher writes the rest
    _sockets.send_copied(worker, [big])
    assert worker._conn.backlog  # the rest of it waits for the flusher
    assert worker.send_small(one_step, (Value.TAG, 2), payload) is not None  # behind it
    assert worker.send_small(one_step, (Value.TAG, 3), b"x" * (32 << 10)) is None  # too big
    assert worker.send_small(one_step, (Value.TAG, 4), payload) is not None
    expected = [in_steps.seal_small((Value.TAG, n), payload) for n in (1, 2, 4)]
    got = take_until(Receiver(router, WireStats()), 4)
    assert [bytes(m[1]) for m in got] == [expected[0], big, *expected[1:]]
    assert all(m[0].bytes == b"w" for m in got)
    controller = _signed.Signer(
        key, WireStats(), sender=_signed.CONTROLLER, upstream=False, trusted_link=True
    )
    window = _signed.ReplayWindow()
    replies = [controller.verify([m[1]], window, sender=tag) for m in (got[0], got[2], got[3])]
    assert replies == [Value(1), Value(2), Value(4)]
    assert _signed.decode_payload([got[3][1]]) == ("ok", 7)
    assert one_step.stats.encoded == 3
    # Replies until the kernel's buffer is full (the last taken in part, or not
    # at all): what it did not take is written after, in order.
    numbers = iter(range(5, 1_000_000))
    sent = []
    while not worker._conn.backlog:
        sent.append(next(numbers))
        assert worker.send_small(one_step, (Value.TAG, sent[-1]), payload) is not None
    sent.append(next(numbers))
    assert worker.send_small(one_step, (Value.TAG, sent[-1]), payload) is not None
    got = take_until(Receiver(router, WireStats()), len(sent))
    assert [bytes(m[1]) for m in got] == [
        in_steps.seal_small((Value.TAG, n), payload) for n in sent
    ]
