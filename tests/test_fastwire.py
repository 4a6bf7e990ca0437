"""The C signing path (monarch_nb._wire._fastwire) against the Python one.

Both must put the same bytes on the wire and refuse the same frames, counted
the same way: a mesh may mix them (a host built without a C compiler), and
the Python path is what runs for big content.
"""

import importlib.util
import os
import pickle
import subprocess
import sys

import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from monarch_nb import Actor, endpoint, this_host
from monarch_nb._wire import _signed
from monarch_nb._wire._messages import Call, Value, to_wire
from monarch_nb._wire._signed import (
    CONTROLLER,
    ReplayWindow,
    Signer,
    WireStats,
    decode_payload,
    new_key,
    sender_tag,
    socket_events,
)
from monarch_nb._wire._sockets import send_one

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("monarch_nb._wire._fastwire") is None,
    reason="monarch_nb._wire._fastwire was not built",
)


def test_the_c_path_is_in_use_where_it_was_built():
    assert os.environ.get("MONARCH_NB_PURE_PYTHON_WIRE", "") in ("", "0")
    assert _signed._fastwire is not None


RANK = sender_tag(b"rank-0")
COUNTERS = (
    "received",
    "dropped_malformed",
    "dropped_bad_signature",
    "dropped_replayed",
    "dropped_misdirected",
    "bytes_digested",
)


def signers(key: bytes, trusted: bool) -> tuple[Signer, Signer]:
    """The controller's signer and a rank's, on one kind of link."""
    return (
        Signer(key, WireStats(), sender=CONTROLLER, upstream=False, trusted_link=trusted),
        Signer(key, WireStats(), sender=RANK, upstream=True, trusted_link=trusted),
    )


FAST = _signed._fastwire


def seal(python: bool, key: bytes, trusted: bool, payload, first_sequence: int = 1) -> list:
    """A Call sealed by the controller, through the Python or the C path."""
    saved = _signed._fastwire
    _signed._fastwire = None if python else FAST
    try:
        signer = Signer(
            key,
            WireStats(),
            sender=CONTROLLER,
            upstream=False,
            trusted_link=trusted,
            first_sequence=first_sequence,
        )
        return [
            bytes(memoryview(f)) for f in signer.encode(Call(7, 1, "echo", True), payload).seal()
        ]
    finally:
        _signed._fastwire = saved


def verify(python: bool, key: bytes, trusted: bool, frames: list, sender=CONTROLLER):
    """What a rank makes of ``frames``, and its counters, through one path."""
    saved = _signed._fastwire
    _signed._fastwire = None if python else FAST
    try:
        rank = Signer(key, WireStats(), sender=RANK, upstream=True, trusted_link=trusted)
        message = rank.verify(frames, ReplayWindow(), sender=sender)
        return message, {name: getattr(rank.stats, name) for name in COUNTERS}
    finally:
        _signed._fastwire = saved


payloads = st.one_of(
    st.none(),
    st.binary(max_size=300),
    # Bytes of 4 KiB or more travel as frames of their own; past 16 KiB hashed,
    # the C path hands the content to hashlib.
    st.lists(st.binary(min_size=4096, max_size=12_000), max_size=3),
    st.text(max_size=20_000),
)


@settings(max_examples=60, deadline=None)
@given(payload=payloads, trusted=st.booleans(), sequence=st.integers(1, 2**40))
def test_c_and_python_seal_the_same_bytes_and_accept_each_other(payload, trusted, sequence):
    key = new_key()
    by_c = seal(False, key, trusted, payload, sequence)
    by_python = seal(True, key, trusted, payload, sequence)
    assert by_c == by_python
    for python in (False, True):
        message, counters = verify(python, key, trusted, by_c)
        assert message == Call(7, 1, "echo", True)
        assert counters["received"] == 1
        assert decode_payload(by_c) == payload


@settings(max_examples=80, deadline=None)
@given(
    payload=payloads,
    trusted=st.booleans(),
    where=st.floats(0, 1, exclude_max=True),
    bit=st.integers(0, 7),
)
def test_c_and_python_refuse_a_flipped_bit_alike(payload, trusted, where, bit):
    key = new_key()
    frames = seal(True, key, trusted, payload)
    sizes = [len(f) for f in frames]
    at = int(where * sum(sizes))
    frame = 0
    while at >= sizes[frame]:
        at -= sizes[frame]
        frame += 1
    tampered = [bytearray(f) for f in frames]
    tampered[frame][at] ^= 1 << bit
    c_result = verify(False, key, trusted, tampered)
    python_result = verify(True, key, trusted, tampered)
    assert c_result == python_result
    # On a trusted link buffer frames are covered by their length only (the transport
    # protects them); anything else flipped is refused.
    first_buffer = 1 if sizes[0] > 57 else 2  # 57: a header alone, the body its own frame
    if not (trusted and frame >= first_buffer):
        assert c_result[0] is None


@pytest.mark.parametrize(
    "case",
    [
        "empty",
        "short header",
        "header alone",
        "short body",
        "meta past the body",
        "unknown flag",
        "sent the other way",
        "sealed by someone else",
        "by length on an untrusted link",
        "wrong key",
    ],
)
def test_c_and_python_count_each_kind_of_refusal_alike(case):
    key = new_key()
    controller, rank = signers(key, trusted=True)
    good = [bytes(f) for f in controller.encode(Call(1, 1, "echo", True), ((), {})).seal()]
    header, body = good[0][:57], good[0][57:]
    frames, sender = good, CONTROLLER
    if case == "empty":
        frames = []
    elif case == "short header":
        frames = [header[:40]]
    elif case == "header alone":
        frames = [header]
    elif case == "short body":
        frames = [header + body[:2]]
    elif case == "meta past the body":
        frames = [header + (10_000).to_bytes(4, "little") + body[4:]]
    elif case == "unknown flag":
        frames = [header[:40] + bytes([header[40] | 0x80]) + header[41:] + body]
    elif case == "sent the other way":
        up = rank.encode(Value(1), None).seal()
        frames = [bytes(f) for f in up]
        sender = None
    elif case == "sealed by someone else":
        sender = sender_tag(b"another")
    elif case == "by length on an untrusted link":
        pass  # sealed on a trusted link, received on an untrusted one
    elif case == "wrong key":
        other, _ = signers(new_key(), trusted=False)
        frames = [bytes(f) for f in other.encode(Call(1, 1, "echo", True), ((), {})).seal()]
    trusted = case != "by length on an untrusted link"
    c_result = verify(False, key, trusted, frames, sender)
    python_result = verify(True, key, trusted, frames, sender)
    assert c_result == python_result
    assert c_result[0] is None
    assert c_result[1]["received"] == 0
    assert sum(c_result[1].values()) == 1  # counted once, under one name


@pytest.mark.parametrize("window_type", [ReplayWindow, _signed.PyReplayWindow])
def test_a_replayed_message_is_refused_on_the_c_path_too(window_type):
    key = new_key()
    controller, rank = signers(key, trusted=True)
    frames = controller.encode(Call(1, 1, "echo", True), ((), {})).seal()
    window = window_type()  # the C path asks either kind of window
    assert rank.verify(frames, window, sender=CONTROLLER) == Call(1, 1, "echo", True)
    assert rank.verify(frames, window, sender=CONTROLLER) is None
    assert rank.stats.dropped_replayed == 1


_U64 = 2**64 - 1


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("ahead"), st.integers(1, 70)),
            st.tuples(st.just("far ahead"), st.integers(900, 1200)),
            st.tuples(st.just("behind"), st.integers(0, 1100)),
            st.tuples(st.just("at"), st.sampled_from([0, 1, 2**63, _U64])),
        ),
        max_size=120,
    )
)
def test_c_and_python_replay_windows_accept_the_same_numbers(steps):
    """The C Window (what ReplayWindow is with the C module) answers every
    sequence number as the pure-Python window does: ahead, far ahead (past the
    window's 1,024 bits), behind (inside and outside it), replays, the extremes."""
    c_window, py_window = ReplayWindow(), _signed.PyReplayWindow()
    assert type(c_window) is not type(py_window)
    highest = 0
    for kind, n in steps:
        number = {"ahead": highest + n, "far ahead": highest + n, "behind": highest - n}.get(
            kind, n
        )
        number = min(max(number, 0), _U64)
        highest = max(highest, number)
        assert c_window.accept(number) == py_window.accept(number), (kind, number)
        assert not c_window.accept(number)  # a second time: a replay
        py_window.accept(number)


def test_a_window_refuses_a_number_far_below_the_highest_without_a_huge_shift():
    """A number 2**64 below the highest is refused at once by both windows (the
    Python one once built a 2**64-bit integer for it)."""
    for window in (ReplayWindow(), _signed.PyReplayWindow()):
        assert window.accept(_U64)
        assert not window.accept(1)
        assert not window.accept(_U64)


def test_the_c_path_takes_zmq_frames_and_reports_the_events_libzmq_reports():
    key = new_key()
    controller, rank = signers(key, trusted=False)
    ctx = zmq.Context.instance()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    try:
        port = router.bind_to_random_port("tcp://127.0.0.1")
        dealer.connect(f"tcp://127.0.0.1:{port}")
        assert socket_events(dealer) == int(dealer.getsockopt(zmq.EVENTS))
        blob = os.urandom(9000)  # a frame of its own, hashed on an untrusted link
        for i in range(3):
            dealer.send_multipart(rank.encode(Value(i), blob).seal())
        taken = []
        while len(taken) < 3:
            assert router.poll(30_000), "the messages never arrived"
            while socket_events(router) & zmq.POLLIN:
                taken.append(router.recv_multipart(copy=False)[1:])
        window = ReplayWindow()
        for i, frames in enumerate(taken):
            assert controller.verify(frames, window, sender=RANK) == Value(i)
            assert decode_payload(frames) == blob
        assert socket_events(router) == int(router.getsockopt(zmq.EVENTS))
        assert controller.stats.bytes_digested == 3 * 9000
    finally:
        router.close(0)
        dealer.close(0)
    with pytest.raises(zmq.ZMQError):
        socket_events(router)


def rank_signer(key: bytes, sequence: int) -> Signer:
    return Signer(
        key, WireStats(), sender=RANK, upstream=True, trusted_link=True, first_sequence=sequence
    )


@settings(max_examples=60, deadline=None)
@given(
    size=st.one_of(st.integers(0, 300), st.integers(16_320, 16_380)),
    sequence=st.integers(1, 2**40),
)
def test_a_reply_sealed_in_one_step_is_the_frame_sealed_in_several(size, sequence):
    """Signer.seal_small (a worker's reply path) gives Encoded.seal's bytes, and
    where the body is too big for it, gives nothing and takes no sequence number."""
    key = new_key()
    value = os.urandom(size)
    payload = pickle.dumps(value, protocol=5)
    body = 4 + len(pickle.dumps((Value.TAG, size), protocol=5)) + len(payload)
    one_step, in_steps = rank_signer(key, sequence), rank_signer(key, sequence)
    frame = one_step.seal_small(to_wire(Value(size)), payload)
    assert (frame is None) == (body > FAST.SMALL_HASH_LIMIT)
    if frame is None:
        # No number was used up: the next message seals with the one it would have.
        assert one_step.encode(Value(1)).seal() == in_steps.encode(Value(1)).seal()
        return
    assert [frame] == in_steps_sealed(in_steps, Value(size), payload)
    assert one_step.stats.bytes_in_band == in_steps.stats.bytes_in_band == body
    controller = Signer(key, WireStats(), sender=CONTROLLER, upstream=False, trusted_link=True)
    assert controller.verify([frame], ReplayWindow(), sender=RANK) == Value(size)
    assert decode_payload([frame]) == value


def in_steps_sealed(signer: Signer, message, payload: bytes) -> list:
    """``message`` digested when encoded and signed when sealed, each step on
    its own (what a message too big for the one-step path goes through)."""
    saved = _signed._SMALL_FRAME_BYTES
    _signed._SMALL_FRAME_BYTES = 0
    try:
        encoded = signer.encode_pickled(message, payload, [])
        assert encoded.meta is None
        return encoded.seal()
    finally:
        _signed._SMALL_FRAME_BYTES = saved


def test_send_one_sends_a_frame_and_reports_the_events_libzmq_reports():
    ctx = zmq.Context.instance()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    try:
        port = router.bind_to_random_port("tcp://127.0.0.1")
        dealer.connect(f"tcp://127.0.0.1:{port}")
        dealer.send(b"hello")
        assert router.poll(30_000), "the first message never arrived"
        identity = router.recv_multipart()[0]
        router.send_multipart([identity, b"pending"])  # input waiting on the dealer
        assert dealer.poll(30_000), "the reply never arrived"
        assert send_one(dealer, b"one frame") == int(dealer.getsockopt(zmq.EVENTS))
        assert send_one(dealer, b"one frame") & zmq.POLLIN
        assert router.poll(30_000)
        assert router.recv_multipart()[1:] == [b"one frame"]
    finally:
        router.close(0)
        dealer.close(0)
    with pytest.raises(zmq.ZMQError):
        send_one(dealer, b"to a closed socket")


class Echo(Actor):
    @endpoint
    def echo(self, x: object) -> object:
        return x

    @endpoint
    def wire(self) -> bool:
        from monarch_nb._wire import _signed

        return _signed._fastwire is not None


def test_a_controller_with_the_c_path_drives_ranks_without_it():
    """A mesh mixing the two paths (a host built without a C compiler) works."""
    procs = this_host().spawn_procs(per_host={"procs": 2}, env={"MONARCH_NB_PURE_PYTHON_WIRE": "1"})
    try:
        echo = procs.spawn("echo", Echo)
        assert echo.wire.call().get(timeout=120).values() == [False, False]
        big = os.urandom(100_000)
        for value in (1, "x" * 20_000, big, [big, b"small"]):
            assert echo.echo.call(value).get(timeout=120).values() == [value, value]
    finally:
        procs.stop()


def test_replies_on_either_side_of_the_one_step_limit_reach_the_caller():
    """A rank seals a small reply in one step and a bigger one as before: values
    around the limit (strings pickle in-band), None, and buffer frames all arrive."""
    procs = this_host().spawn_procs(per_host={"procs": 2})
    try:
        echo = procs.spawn("echo", Echo)
        assert echo.wire.call().get(timeout=120).values() == [True, True]
        values = [None, 0, "", b"small", *("x" * n for n in range(16_330, 16_390, 7))]
        values += [os.urandom(100_000), [os.urandom(5_000), "y" * 20_000]]
        for value in values:
            assert echo.echo.call(value).get(timeout=120).values() == [value, value]
    finally:
        procs.stop()


def test_a_controller_without_the_c_path_drives_a_mesh(tmp_path):
    script = tmp_path / "pure.py"
    script.write_text(
        "from monarch_nb import Actor, endpoint, this_host\n"
        "from monarch_nb._wire import _signed\n"
        "class Echo(Actor):\n"
        "    @endpoint\n"
        "    def echo(self, x):\n"
        "        return x\n"
        "assert _signed._fastwire is None\n"
        "procs = this_host().spawn_procs(per_host={'procs': 2})\n"
        "try:\n"
        "    echo = procs.spawn('echo', Echo)\n"
        "    for v in (1, 'x' * 20000, bytes(100000)):\n"
        "        assert echo.echo.call(v).get(timeout=120).values() == [v, v]\n"
        "finally:\n"
        "    procs.stop()\n"
        "print('ok')\n"
    )
    env = {**os.environ, "MONARCH_NB_PURE_PYTHON_WIRE": "1"}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


_DIGESTS_AGAINST_HASHLIB = """
import hashlib, hmac, os, sys
from monarch_nb._wire import _fastwire
print(_fastwire.sha_extensions())
for n in list(range(0, 300)) + [4095, 4096, 9000, 16_000]:
    body = os.urandom(n)
    want = hashlib.sha256(n.to_bytes(8, "little") + body).digest()
    assert _fastwire.digest(body, [], True) == (want, 0), n
    buffer = os.urandom(min(n // 2, _fastwire.SMALL_HASH_LIMIT - n))
    want = hashlib.sha256(
        n.to_bytes(8, "little") + body + len(buffer).to_bytes(8, "little") + buffer
    ).digest()
    assert _fastwire.digest(body, [buffer], False) == (want, len(buffer)), n
key, content = os.urandom(32), os.urandom(32)
header = _fastwire.header(_fastwire.key_state(key), 9, 1, b"s" * 16, content)
signed = header[32:] + content
assert header[:32] == hmac.new(key, signed, hashlib.sha256).digest()
"""


@pytest.mark.parametrize("portable", [False, True])
def test_sha256_matches_hashlib_on_the_cpu_instructions_and_the_portable_rounds(portable):
    env = {**os.environ, "MONARCH_NB_PORTABLE_SHA256": "1" if portable else ""}
    done = subprocess.run(
        [sys.executable, "-c", _DIGESTS_AGAINST_HASHLIB],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    uses_instructions = done.stdout.strip() == "True"
    if portable:
        assert not uses_instructions
    elif not uses_instructions:
        pytest.skip("this CPU has no SHA instructions: only the portable rounds ran")


def _every_kind_with_fields() -> list[tuple[type, tuple]]:
    """Each message kind the wire knows, with a value for each of its fields."""
    import dataclasses

    from monarch_nb._wire._messages import _BY_TAG

    kinds = []
    for tag, (cls, count) in sorted(_BY_TAG.items()):
        names = [f.name for f in dataclasses.fields(cls)]
        assert len(names) == count
        kinds.append((cls, tuple(f"{name}-{tag}" for name in names)))
    return kinds


@pytest.mark.parametrize(
    ("cls", "values"), _every_kind_with_fields(), ids=lambda v: getattr(v, "__name__", "")
)
def test_a_message_built_in_c_is_the_one_its_init_builds(cls, values):
    """admit() builds a received message without its __init__: for every kind,
    the same class, the same fields, equal, and still frozen."""
    import dataclasses

    from monarch_nb._wire._messages import BUILDABLE

    assert cls.TAG in BUILDABLE  # else it takes from_wire's path (also right, but slower)
    key = new_key()
    controller, rank = signers(key, trusted=True)
    meta = pickle.dumps((cls.TAG, *values), protocol=5)
    frame = controller.frame(controller._flags, meta, b"")
    message = rank.verify([frame], ReplayWindow(), sender=CONTROLLER)
    expected = cls(*values)
    assert type(message) is cls
    assert message == expected
    assert hash(message) == hash(expected)
    assert to_wire(message) == to_wire(expected)
    if values:
        name = dataclasses.fields(message)[0].name
        with pytest.raises(AttributeError):
            setattr(message, name, "changed")
    assert rank.stats.received == 1
    assert rank.stats.unknown_messages == 0


@pytest.mark.parametrize(
    "meta",
    [b"not a pickle", pickle.dumps((Call.TAG, 1, 2), protocol=5), pickle.dumps(42, protocol=5)],
    ids=["unpicklable", "wrong field count", "not a tuple"],
)
def test_a_signed_meta_that_names_no_message_is_an_error_counted_once(meta):
    """Signed and fresh, but unreadable: UnknownMessage (the caller reports it),
    counted as received and unknown, on the C path as on the Python one."""
    from monarch_nb._wire._messages import UnknownMessage

    for python in (False, True):
        key = new_key()
        controller, rank = signers(key, trusted=True)
        frame = controller.frame(controller._flags, meta, b"")
        saved = _signed._fastwire
        _signed._fastwire = None if python else FAST
        try:
            with pytest.raises(UnknownMessage):
                rank.verify([frame], ReplayWindow(), sender=CONTROLLER)
        finally:
            _signed._fastwire = saved
        assert (rank.stats.received, rank.stats.unknown_messages) == (1, 1), python


@pytest.mark.parametrize(
    "payload",
    [
        None,
        ((), {}),
        ((1, "two"), {"three": b"3" * 100}),
        b"x" * 300_000,
        bytearray(b"y" * 300_000),
    ],
    ids=["none", "no arguments", "small", "large bytes", "large bytearray"],
)
@pytest.mark.parametrize("trusted", [True, False])
def test_c_and_python_unpickle_a_payload_alike(payload, trusted):
    """decode_payload in one C call gives what the Python path gives, for payloads
    in the body and out of band (and a body in a frame of its own)."""
    key = new_key()
    controller, _ = signers(key, trusted)
    frames = controller.encode(Call(1, 1, "echo", True), payload).seal()
    c_value = decode_payload(frames)
    saved = _signed._fastwire
    _signed._fastwire = None
    try:
        python_value = decode_payload(frames)
    finally:
        _signed._fastwire = saved
    assert c_value == python_value == payload
    assert type(c_value) is type(payload)


def test_a_payload_buffer_unpickled_in_c_is_the_frame_not_a_copy():
    torch = pytest.importorskip("torch")
    key = new_key()
    controller, _ = signers(key, trusted=True)
    tensor = torch.arange(100_000, dtype=torch.float32)
    frames = [
        bytearray(memoryview(f)) for f in controller.encode(Call(1, 1, "e", True), tensor).seal()
    ]
    assert len(frames) > 1  # the tensor's bytes went out of band
    value = decode_payload(frames)
    assert torch.equal(value, tensor)
    frames[-1][:4] = b"\xff\xff\xff\xff"  # the frame's memory is the tensor's
    assert not torch.equal(value, tensor)
