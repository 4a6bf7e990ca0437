"""The wire's socket operations on libzmq (monarch_nb._wire._fastzmq) against pyzmq.

Whole messages taken in C must be the messages pyzmq would give, frame for
frame (zero-copy, writable, as ``zmq.Frame``), across budgets and oversized
messages; sends in C must never wait: pyzmq does what libzmq refuses.
"""

import importlib.util
import os

import pytest
import torch
import zmq

from monarch_nb._wire import _serialize, _signed, _sockets
from monarch_nb._wire._signed import Receiver, WireStats

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("monarch_nb._wire._fastzmq") is None,
    reason="monarch_nb._wire._fastzmq was not built",
)


def test_the_c_path_is_bound_to_the_libzmq_pyzmq_calls():
    """Built, it must be in use: a lookup that failed would only make things slower,
    silently, so say it here."""
    assert os.environ.get("MONARCH_NB_PURE_PYTHON_WIRE", "") in ("", "0")
    assert _sockets._fastzmq is not None


def take_all(receiver: Receiver, count: int, **budgets) -> list[list]:
    """``count`` whole messages, taken as they arrive."""
    got: list[list] = []
    while len(got) < count:
        assert receiver.socket.poll(30_000), f"only {len(got)} of {count} messages came"
        while True:
            done, more = receiver.take(**budgets)
            got.extend(done)
            if not more:
                break
    return got


def test_messages_taken_in_c_are_pyzmqs_frame_for_frame_across_budgets(pair):
    router, dealer = pair
    sent = [[os.urandom(n) for n in sizes] for sizes in ([1], [0, 5], [100, 70_000, 3], [9] * 7)]
    for message in sent * 5:
        dealer.send_multipart(message)
    receiver = Receiver(router, WireStats())
    # Three frames a take at most: messages are begun in one take and ended in another.
    got = take_all(receiver, len(sent) * 5, frames=3, messages=2)
    assert [[bytes(f) for f in m[1:]] for m in got] == sent * 5
    frame = got[2][2]
    assert type(frame).__name__ == "Frame"
    assert len(frame) == 70_000
    assert frame.bytes == sent[2][1]
    assert frame.buffer.tobytes() == sent[2][1]
    assert not memoryview(frame).readonly  # as pyzmq's: tensors are rebuilt on them


def test_a_tensor_rebuilt_on_a_c_frame_keeps_its_memory_alive(pair):
    router, dealer = pair
    tensor = torch.arange(100_000, dtype=torch.float32)
    body, buffers = _serialize.dumps(tensor)
    dealer.send_multipart([body, *[b.raw() for b in buffers]])
    (message,) = take_all(Receiver(router), 1)
    rebuilt = _serialize.loads(message[1], message[2:])
    del message  # only the tensor holds the frame now
    assert torch.equal(rebuilt, tensor)
    rebuilt += 1  # writable, as before
    assert rebuilt[5].item() == 6


def test_an_oversized_message_is_dropped_in_c_and_the_next_one_kept(pair, monkeypatch):
    router, dealer = pair
    monkeypatch.setattr(_signed, "MAX_FRAMES_PER_MESSAGE", 50)
    dealer.send_multipart([b"x"] * 200)
    dealer.send_multipart([b"after"])
    stats = WireStats()
    (message,) = take_all(Receiver(router, stats), 1, frames=16)
    assert [f.bytes for f in message[1:]] == [b"after"]
    assert stats.dropped_oversized == 1


def test_a_send_libzmq_cannot_take_now_is_left_to_pyzmq(pair):
    ctx = zmq.Context.instance()
    lonely = ctx.socket(zmq.DEALER)
    lonely.setsockopt(zmq.IMMEDIATE, 1)  # no peer, so nowhere to queue a message
    try:
        lonely.connect("tcp://127.0.0.1:9")
        assert _sockets.send_copied(lonely, [b"a", b"b"]) == 0
        with pytest.raises(zmq.Again):
            lonely.send(b"a", zmq.NOBLOCK)  # what the caller then does, through pyzmq
    finally:
        lonely.close(0)
    router, dealer = pair
    assert _sockets.send_copied(dealer, [b"one", b"two"]) == 2
    (message,) = take_all(Receiver(router), 1)
    assert [f.bytes for f in message[1:]] == [b"one", b"two"]


def test_a_closed_socket_raises_pyzmqs_error_not_a_crash():
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.close(0)
    assert _sockets.send_copied(socket, [b"x"]) == 0
    with pytest.raises(zmq.ZMQError):
        Receiver(socket).take()
    with pytest.raises(zmq.ZMQError):
        _sockets.socket_events(socket)


def test_a_cast_goes_to_each_peer_and_an_unknown_one_raises_as_pyzmq_does():
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealers = []
    try:
        for i in range(3):
            dealer = ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.ROUTING_ID, b"peer-%d" % i)
            dealer.connect(f"tcp://127.0.0.1:{port}")
            dealer.send(b"hello")
            dealers.append(dealer)
        for _ in dealers:  # the router knows a peer once it heard from it
            assert router.poll(30_000)
            router.recv_multipart()
        identities = [b"peer-0", b"peer-1", b"peer-2"]
        _sockets.send_each_copied(router, identities, b"cast")
        for dealer in dealers:
            assert dealer.poll(30_000), "a peer of the cast got nothing"
            assert dealer.recv_multipart() == [b"cast"]
        with pytest.raises(zmq.ZMQError) as raised:
            _sockets.send_each_copied(router, [b"peer-0", b"nobody", b"peer-2"], b"again")
        assert raised.value.errno == zmq.EHOSTUNREACH
        assert dealers[0].poll(30_000)
        assert dealers[0].recv_multipart() == [b"again"]  # sent before the unknown one
        assert not dealers[2].poll(200)  # not after it: the error stopped the cast
    finally:
        router.close(0)
        for dealer in dealers:
            dealer.close(0)
