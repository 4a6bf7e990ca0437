"""What a message carries is what the caller's memory held when it was sent.

Large tensor, array and bytearray frames go to the socket without a copy, and
what the socket does not take at once (the link's kernel buffer is full, or
libzmq's I/O thread has not got to it) is sent after ``send`` returns. The
caller may change that memory then (fill a tensor with its next step's values,
a rank's next endpoint updating the weights it just returned): the message
must still carry the old bytes, and still verify. These tests send a message
far larger than any socket buffer to a peer that reads only after the sender
has changed its memory, on each link the wire runs on.
"""

from __future__ import annotations

import os
import select
import threading
import time
import tracemalloc

import pytest
import zmq

from monarch_nb._wire._messages import Call
from monarch_nb._wire._signed import (
    CONTROLLER,
    Receiver,
    ReplayWindow,
    Signer,
    WireStats,
    decode_payload,
    new_key,
    sender_tag,
)
from monarch_nb._wire._unix_link import LinkDealer, LinkRouter

BIG = 24 << 20  # more than a Unix socket's or libzmq's buffers take at once
RANK_NAMES = [b"rank-0", b"rank-1", b"rank-2"]
RANK_NAME = RANK_NAMES[0]


def _unix_link(tmp_path, ranks: int):
    router = LinkRouter(str(tmp_path / "link"))
    dealers = [LinkDealer(router.address, name) for name in RANK_NAMES[:ranks]]
    for dealer in dealers:
        dealer.send_parts([b"hello"])
    assert sorted(_take(router, ranks)) == [[name, b"hello"] for name in RANK_NAMES[:ranks]]

    def close():
        for dealer in dealers:
            dealer.close(0)
        router.close()

    return router, dealers, close


def _zmq_link(tmp_path, ranks: int, scheme: str):
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.linger = 0
    if scheme == "tcp":
        port = router.bind_to_random_port("tcp://127.0.0.1")
        address = f"tcp://127.0.0.1:{port}"
    else:
        address = f"ipc://{tmp_path}/zmq-link"
        router.bind(address)
    dealers = []
    for name in RANK_NAMES[:ranks]:
        dealer = context.socket(zmq.DEALER)
        dealer.linger = 0
        dealer.identity = name
        dealer.connect(address)
        dealer.send(b"hello")
        dealers.append(dealer)
    assert sorted(_take(router, ranks)) == [[name, b"hello"] for name in RANK_NAMES[:ranks]]

    def close():
        for dealer in dealers:
            dealer.close(0)
        router.close(0)
        context.term()

    return router, dealers, close


def _take(socket, count: int, timeout: float = 60.0) -> list[list[bytes]]:
    """``count`` whole messages, polled as the wire polls."""
    receiver = Receiver(socket, WireStats())
    poller = select.poll()
    fd = socket.fileno() if hasattr(socket, "send_parts") else socket.getsockopt(zmq.FD)
    poller.register(fd, select.POLLIN)
    got: list[list[bytes]] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        assert time.monotonic() < deadline, f"only {len(got)} of {count} messages came"
        done, more = receiver.take()
        got.extend([bytes(memoryview(f)) for f in m] for m in done)
        if not more and len(got) < count:
            poller.poll(100)
    return got


def _link(kind: str, tmp_path, ranks: int):
    if kind == "unix":
        return _unix_link(tmp_path, ranks)
    return _zmq_link(tmp_path, ranks, kind.split("-")[1])


LINKS = ["unix", "zmq-ipc", "zmq-tcp"]


@pytest.fixture(params=LINKS)
def pair(request, tmp_path):
    router, (dealer,), close = _link(request.param, tmp_path, 1)
    # Untrusted (buffers hashed) where the transport does not authenticate its
    # peer: a changed buffer would then also fail the digest, and be dropped.
    trusted = request.param != "zmq-tcp"
    yield router, dealer, trusted
    close()


@pytest.mark.parametrize("kind", ["bytearray", "tensor"])
def test_a_big_argument_changed_right_after_its_send_arrives_as_it_was(pair, kind):
    router, dealer, trusted = pair
    key = new_key()
    controller = Signer(key, WireStats(), sender=CONTROLLER, upstream=False, trusted_link=trusted)
    rank = Signer(
        key, WireStats(), sender=sender_tag(RANK_NAME), upstream=True, trusted_link=trusted
    )
    if kind == "tensor":
        torch = pytest.importorskip("torch")
        data = torch.zeros(BIG // 4)
        expected = torch.zeros(BIG // 4)
    else:
        data = bytearray(BIG)
        expected = bytearray(BIG)
    controller.encode(Call(7, 1, "echo", True), (data, 1)).send(router, RANK_NAME)
    # The next step's values, written as soon as send returned; the peer has
    # not read a byte of the message yet.
    if kind == "tensor":
        data.fill_(1.0)
    else:
        data[:] = b"\x01" * BIG
    (frames,) = _take(dealer, 1)
    message = rank.verify(frames, ReplayWindow(), sender=CONTROLLER)
    assert message is not None, f"the message was dropped: {rank.stats}"
    payload, tag = decode_payload(frames)
    assert tag == 1
    if kind == "tensor":
        assert torch.equal(payload, expected), "the tensor's later values were sent"
    else:
        assert payload == expected, "the bytearray's later values were sent"


def test_bytes_still_go_without_a_copy(pair):
    """``bytes`` never change, so they still go zero-copy on libzmq (the copy
    rule is for memory the caller may write), and arrive whole."""
    router, dealer, trusted = pair
    key = new_key()
    controller = Signer(key, WireStats(), sender=CONTROLLER, upstream=False, trusted_link=trusted)
    data = os.urandom(1 << 20) * 8
    encoded = controller.encode(Call(7, 1, "echo", True), data)
    assert encoded.copy[-1] is False
    encoded.send(router, RANK_NAME)
    (frames,) = _take(dealer, 1)
    assert decode_payload(frames) == data


@pytest.mark.parametrize("kind", LINKS)
def test_a_cast_copies_the_callers_memory_once_for_all_its_ranks(kind, tmp_path):
    """A cast of a tensor's memory to several ranks, changed right after: every
    rank gets what it held. The copy is made once for the cast, not once a
    rank (on the link, where Python allocates it, traced to show it)."""
    router, dealers, close = _link(kind, tmp_path, 3)
    try:
        key = new_key()
        trusted = kind != "zmq-tcp"
        controller = Signer(
            key, WireStats(), sender=CONTROLLER, upstream=False, trusted_link=trusted
        )
        data = bytearray(BIG)
        encoded = controller.encode(Call(7, 1, "echo", True), data)
        frames = encoded.seal()
        peak = _peak_allocated(lambda: encoded.send_each(router, RANK_NAMES, frames))
        data[:] = b"\x01" * BIG
        if kind == "unix":  # one copy (less what the kernels took), not three
            assert peak < 1.5 * BIG, f"{peak / BIG:.1f} copies of the cast's tensor"
        for name, dealer in zip(RANK_NAMES, dealers, strict=True):
            (got,) = _take(dealer, 1)
            rank = Signer(
                key, WireStats(), sender=sender_tag(name), upstream=True, trusted_link=trusted
            )
            assert rank.verify(got, ReplayWindow(), sender=CONTROLLER) is not None, name
            assert decode_payload(got) == bytes(BIG), f"{name!r} got the later values"
    finally:
        close()


def test_a_closed_link_starts_no_flusher(tmp_path):
    """A send that finds the socket closed (a sender racing the close) must not
    start a flusher thread that nothing would ever stop."""
    router, (dealer,), close = _unix_link(tmp_path, 1)
    close()
    before = {t.ident for t in threading.enumerate() if t.name == "monarch_nb-link-flush"}
    dealer._queued(dealer._conn)  # where a send that could not finish lands
    router.send_to(RANK_NAME, [b"late"])
    after = {t.ident for t in threading.enumerate() if t.name == "monarch_nb-link-flush"}
    assert after <= before


def test_the_link_copies_nothing_its_socket_takes_at_once(tmp_path):
    """The README's rule: on the link a tensor's memory is written without a
    copy as far as the kernel's socket buffer takes it at once (1 MiB here);
    only a remainder is copied."""
    router, (dealer,), close = _unix_link(tmp_path, 1)
    try:
        controller = Signer(
            new_key(), WireStats(), sender=CONTROLLER, upstream=False, trusted_link=True
        )
        data = bytearray(1 << 20)
        encoded = controller.encode(Call(7, 1, "echo", True), data)
        frames = encoded.seal()
        peak = _peak_allocated(lambda: encoded.send(router, RANK_NAME, frames))
        assert peak < len(data) // 4, f"{peak:,} bytes allocated to send {len(data):,}"
        (got,) = _take(dealer, 1)
        assert decode_payload(got) == data
    finally:
        close()


def _peak_allocated(send) -> int:
    """The most memory Python held allocated while ``send()`` ran, in bytes."""
    tracemalloc.start()
    try:
        send()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
