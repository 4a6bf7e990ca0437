"""The wire: signed frames, replay protection, encode once, buffers out of band."""

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
import zmq
from rogues import Rogue

from monarch_nb import Actor, endpoint
from monarch_nb._controller._client import Controller
from monarch_nb._services import _config
from monarch_nb._wire import _serialize
from monarch_nb._wire._messages import Call, Value
from monarch_nb._wire._signed import (
    CONTROLLER,
    ReplayWindow,
    Signer,
    WireStats,
    decode_payload,
    new_key,
    sender_tag,
)

ROOT = Path(__file__).resolve().parent.parent


class Evil:
    """Unpickling this creates a file: proof that a frame was unpickled."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


class Echo(Actor):
    @endpoint
    def echo(self, x: object) -> object:
        return x

    @endpoint
    def describe(self, x: object) -> tuple:
        return (
            type(x).__name__,
            getattr(x, "dtype", None) and str(x.dtype),
            getattr(x, "shape", None) and tuple(x.shape),
        )


RANK_0, RANK_1 = sender_tag(b"rank-0"), sender_tag(b"rank-1")


def from_controller(key: bytes, **options) -> Signer:
    """The controller's signer: it sends downstream and takes what comes up."""
    return Signer(key, WireStats(), sender=CONTROLLER, upstream=False, **options)


def from_rank(key: bytes, tag: bytes = RANK_0, **options) -> Signer:
    """A rank's signer: it sends upstream and takes what comes down."""
    return Signer(key, WireStats(), sender=tag, upstream=True, **options)


def receive(router):
    assert router.poll(5000)
    return router.recv_multipart(copy=False)[1:]


def test_signed_message_round_trip_over_real_sockets(pair):
    router, dealer = pair
    key = new_key()
    sender, receiver = from_controller(key), from_rank(key)
    message = Call(1, 7, "step", True)
    dealer.send_multipart(sender.encode(message, {"x": b"y" * 10000}).seal(), copy=False)
    frames = receive(router)
    assert receiver.verify(frames, ReplayWindow(), sender=CONTROLLER) == message
    assert decode_payload(frames) == {"x": b"y" * 10000}
    assert receiver.stats.received == 1


def test_forged_unsigned_and_replayed_frames_are_dropped_unread(pair, tmp_path):
    router, dealer = pair
    key = new_key()
    receiver = from_controller(key)
    marker = tmp_path / "unpickled"
    evil = pickle.dumps(Evil(str(marker)))
    header = b"\0" * 32 + (1).to_bytes(8, "little") + bytes((1,)) + RANK_0
    unsigned = header + len(evil).to_bytes(4, "little") + evil
    forged = from_rank(new_key()).encode(Value(1), Evil(str(marker))).seal()
    genuine = from_rank(key).encode(Value(2), None).seal()
    sent = [
        [b"short"],  # truncated: not even an envelope
        [unsigned, evil],  # a well-formed envelope whose meta is a malicious pickle
        forged,  # signed, but with another key
        genuine,
        genuine,  # replayed
    ]
    for frames in sent:
        dealer.send_multipart(frames)
    window = ReplayWindow()
    results = [receiver.verify(receive(router), window, sender=RANK_0) for _ in sent]
    assert [r is not None for r in results] == [False, False, False, True, False]
    stats = receiver.stats
    assert stats.dropped_malformed == 1
    assert stats.dropped_bad_signature == 2
    assert stats.dropped_replayed == 1
    assert not marker.exists()


def with_header_byte(frames: list, offset: int, value: bytes) -> list:
    """``frames`` with the header's bytes at ``offset`` replaced (an attacker's edit)."""
    first = bytes(frames[0])
    return [first[:offset] + value + first[offset + len(value) :], *frames[1:]]


SENDER_AT, FLAGS_AT = 41, 40  # signature(32) | sequence(8) | flags(1) | sender(16)


def test_the_signature_binds_the_sender_and_the_direction():
    key = new_key()
    controller, rank_0, rank_1 = from_controller(key), from_rank(key), from_rank(key, RANK_1)
    said_by_0 = rank_0.encode(Value(1), "from rank 0").seal()
    # Rank 0's message replayed on rank 1's link: refused, unread.
    assert controller.verify(said_by_0, ReplayWindow(), sender=RANK_1) is None
    assert controller.stats.dropped_misdirected == 1
    # The sender field rewritten to rank 1: the signature no longer matches.
    relabelled = with_header_byte(said_by_0, SENDER_AT, RANK_1)
    assert controller.verify(relabelled, ReplayWindow(), sender=RANK_1) is None
    assert controller.stats.dropped_bad_signature == 1
    # A controller's message reflected back to a controller (or a rank's to a
    # rank): the wrong direction, whoever it claims to be from.
    downstream = controller.encode(Call(1, 7, "step", True)).seal()
    assert from_controller(key).verify(downstream, ReplayWindow(), sender=None) is None
    assert rank_1.verify(said_by_0, ReplayWindow(), sender=None) is None
    flipped = with_header_byte(downstream, FLAGS_AT, bytes((1,)))  # now "upstream"
    assert from_controller(key).verify(flipped, ReplayWindow(), sender=CONTROLLER) is None
    # Where the receiver cannot know the sender, the direction still refuses
    # its own requests sent back to it as if they were replies.
    own_request = from_controller(key).encode(Call(2, 7, "step", True)).seal()
    assert from_controller(key).verify(own_request, ReplayWindow(), sender=None) is None
    # And the genuine message on its own link passes.
    assert controller.verify(said_by_0, ReplayWindow(), sender=RANK_0) == Value(1)


def test_bulk_frames_are_hashed_only_where_the_link_does_not_protect_them():
    key = new_key()
    tensor = torch.arange(1 << 20, dtype=torch.float32)  # 4 MiB, out of band
    # A trusted link (our private Unix socket, or CURVE): buffers by length only.
    sender, receiver = from_rank(key, trusted_link=True), from_controller(key, trusted_link=True)
    frames = sender.encode(Value(1), tensor).seal()
    assert receiver.verify(frames, ReplayWindow(), sender=RANK_0) == Value(1)
    assert torch.equal(decode_payload(frames), tensor)
    assert sender.stats.bytes_digested == receiver.stats.bytes_digested == 0
    # Its frame boundaries are still signed: a buffer cut short is refused.
    cut = [*frames[:-1], memoryview(frames[-1])[:-4]]
    trusted = from_controller(key, trusted_link=True)
    assert trusted.verify(cut, ReplayWindow(), sender=RANK_0) is None
    # A receiver on a plain TCP link refuses a message that leaves its bulk to
    # the transport, and the flag cannot be cleared without breaking the signature.
    plain = from_controller(key)
    assert plain.verify(frames, ReplayWindow(), sender=RANK_0) is None
    assert plain.stats.dropped_misdirected == 1
    cleared = with_header_byte(frames, FLAGS_AT, bytes((1,)))  # upstream, hashed
    assert plain.verify(cleared, ReplayWindow(), sender=RANK_0) is None
    assert plain.stats.dropped_bad_signature == 1
    # On a plain link every buffer byte is hashed once by each side, and a byte
    # changed in flight is caught.
    sender, receiver = from_rank(key), from_controller(key)
    frames = sender.encode(Value(2), tensor).seal()
    tampered = bytearray(frames[-1])
    tampered[100] ^= 1
    assert receiver.verify([*frames[:-1], tampered], ReplayWindow(), sender=RANK_0) is None
    assert receiver.verify(frames, ReplayWindow(), sender=RANK_0) == Value(2)
    assert sender.stats.bytes_digested == 4 << 20
    assert receiver.stats.bytes_digested == 2 * (4 << 20)  # the tampered copy, then the real


def test_sequence_numbers_leave_in_send_order_whoever_encoded_first():
    # A big payload encoded on one thread, small ones sent meanwhile on another:
    # numbers are taken when sealing (at send time), so none arrives as a replay.
    key = new_key()
    sender, receiver = from_rank(key), from_controller(key)
    big = sender.encode(Value(1), b"x" * (32 << 20))
    small = [sender.encode(Value(i)) for i in range(2, 3000)]
    window = ReplayWindow()
    for message in small:
        assert receiver.verify(message.seal(), window, sender=RANK_0) is not None
    frames = big.seal()
    assert len(frames) == 2  # header and small body in one frame, the bytes out of band
    assert receiver.verify(frames, window, sender=RANK_0) == Value(1)
    assert decode_payload(frames) == b"x" * (32 << 20)
    assert receiver.stats.dropped_replayed == 0


def test_messages_of_one_sender_may_arrive_out_of_order_but_only_once():
    key = new_key()
    sender, receiver = from_rank(key), from_controller(key)
    first, second = (sender.encode(Value(i)).seal() for i in (1, 2))
    window = ReplayWindow()
    arrivals = [second, first, first, second]
    results = [receiver.verify(f, window, sender=RANK_0) for f in arrivals]
    assert results == [Value(2), Value(1), None, None]
    assert receiver.stats.dropped_replayed == 2


def test_replay_window_accepts_each_number_once_in_any_order():
    window = ReplayWindow()
    # Two threads of one sender may send 3 before 2: both count, neither twice.
    assert [window.accept(n) for n in (1, 3, 2, 2, 3, 1)] == [True, True, True, False, False, False]
    assert window.accept(5000)
    assert not window.accept(4)  # older than the window: could be a replay, so refused
    assert window.accept(4999)


def test_a_signed_message_of_an_unknown_kind_is_an_error_not_a_silent_drop(monkeypatch):
    from monarch_nb._wire import _messages
    from monarch_nb._wire._messages import UnknownMessage

    key = new_key()
    sender, receiver = from_rank(key), from_controller(key)

    class Rogue(Value):  # a kind the receiver does not know: a newer peer's tag
        TAG = 999

    monkeypatch.setitem(_messages._FIELDS, Rogue, lambda m: (m.call_id,))

    with pytest.raises(UnknownMessage, match="unknown message tag 999"):
        receiver.verify(sender.encode(Rogue(1)).seal(), ReplayWindow(), sender=RANK_0)
    assert receiver.stats.unknown_messages == 1


def test_frames_forged_to_the_controller_are_dropped_and_counted(procs4, tmp_path):
    controller = Controller.get()
    before = controller.stats.snapshot()
    marker = tmp_path / "unpickled"
    evil = pickle.dumps(Evil(str(marker)))
    # A rogue that claims a live worker's identity is refused by the controller's
    # socket itself; an anonymous rogue reaches us and is dropped before anything
    # is unpickled.
    impostor, anonymous = Rogue(procs4._group.identity(0)), Rogue()
    try:
        for rogue in (impostor, anonymous):
            rogue.connect(controller.address)
            for _ in range(5):
                rogue.send_multipart([b"\0" * 61 + evil, evil])
        echo = procs4.spawn("forged", Echo)
        for _ in range(100):
            if controller.stats.dropped_unknown_peer - before.dropped_unknown_peer >= 5:
                break
            echo.echo.call(1).get(timeout=10)
    finally:
        impostor.close(0)
        anonymous.close(0)
    assert controller.stats.dropped_unknown_peer - before.dropped_unknown_peer == 5
    assert not marker.exists()
    assert echo.echo.call(2).get(timeout=10).values() == [2] * 4  # the mesh is unaffected


def test_a_cast_is_encoded_once_however_many_ranks(procs4):
    echo = procs4.spawn("once", Echo)
    stats = Controller.get().stats
    encoded, sent = stats.encoded, stats.sent
    echo.echo.call(np.zeros(1000)).get(timeout=10)
    assert stats.encoded - encoded == 1
    assert stats.sent - sent == 4


@pytest.mark.parametrize(
    "value",
    [
        np.arange(1 << 18, dtype=np.float32),
        torch.arange(1 << 18, dtype=torch.float32),
        b"\x01" * (1 << 20),
        bytearray(b"\x02" * (1 << 20)),
    ],
    ids=["ndarray", "tensor", "bytes", "bytearray"],
)
def test_large_buffers_travel_out_of_band(procs4, value):
    echo = procs4.slice(procs=0).spawn("oob", Echo)
    stats = Controller.get().stats
    in_band, out_of_band = stats.bytes_in_band, stats.bytes_out_of_band
    result = echo.echo.call_one(value).get(timeout=10)
    assert type(result) is type(value)
    if isinstance(value, torch.Tensor):
        assert torch.equal(result, value)
    else:
        assert bytes(memoryview(result).cast("B")) == bytes(memoryview(value).cast("B"))
    # Out: the controller encoded 1 MiB out of band and only a small pickle in band.
    assert stats.bytes_out_of_band - out_of_band == 1 << 20
    assert stats.bytes_in_band - in_band < 1024


def test_the_controller_pickles_what_cloudpickle_would_send_by_reference_itself(monkeypatch):
    # The controller pickles with the C pickler and starts over in cloudpickle
    # when a function or class may have to travel by value. Those found under
    # their name in an imported module other than __main__ go by reference in
    # cloudpickle too, so the C pickler sends them itself: tensors, arrays and
    # bulk bytes (whose rebuilders are monarch_nb's, torch's and numpy's
    # functions), and the stdlib's and other packages' classes. Each of these
    # fell back before, at 2.5-4x the cost of the whole pickling.
    import datetime
    import decimal
    import pathlib

    payload = (
        (torch.arange(6.0), torch.zeros(1 << 16), bytes(1 << 20), bytearray(1 << 20)),
        {
            "shape": torch.Size([2, 3]),
            "dtype": torch.float16,
            "array": np.arange(3.0),
            "error": ValueError("bad"),
            "when": datetime.datetime(2026, 11, 26),
            "path": pathlib.PurePosixPath("/tmp"),
            "amount": decimal.Decimal("1.5"),
            "layer": torch.nn.Linear(2, 2),
            "kind": zmq.SocketType.ROUTER,
        },
    )

    def no_cloudpickle():
        raise AssertionError("fell back to cloudpickle")

    monkeypatch.setattr(_serialize, "_cloudpickler", no_cloudpickle)
    body, buffers = _serialize.dumps(payload)
    args, kwargs = _serialize.loads(body, [bytearray(b.raw()) for b in buffers])
    assert torch.equal(args[0], payload[0][0])
    assert torch.equal(args[1], payload[0][1])
    assert args[2] == payload[0][2]
    assert args[3] == payload[0][3]
    assert kwargs.pop("array").tolist() == [0.0, 1.0, 2.0]
    assert repr(kwargs.pop("error")) == "ValueError('bad')"
    assert torch.equal(kwargs.pop("layer").weight, payload[1]["layer"].weight)
    expected = dict(payload[1])
    for key in ("array", "error", "layer"):
        del expected[key]
    assert kwargs == expected


def test_what_cloudpickle_would_send_by_value_still_goes_through_it(monkeypatch):
    def no_cloudpickle():
        raise AssertionError("fell back to cloudpickle")

    monkeypatch.setattr(_serialize, "_cloudpickler", no_cloudpickle)

    def made_in_a_cell():
        return 1

    made_in_a_cell.__module__ = "__main__"
    with pytest.raises(AssertionError, match="fell back"):  # a notebook's function
        _serialize.dumps((made_in_a_cell,))

    def local():
        return 2

    with pytest.raises(AssertionError, match="fell back"):  # not found under its name
        _serialize.dumps((local,))

    class Local:
        pass

    with pytest.raises(AssertionError, match="fell back"):  # a local class, an instance
        _serialize.dumps((Local,))

    import types

    import cloudpickle

    module = types.ModuleType("user_helpers")  # a user's module, imported

    class Helper:
        pass

    Helper.__module__, Helper.__qualname__ = "user_helpers", "Helper"
    module.Helper = Helper
    monkeypatch.setitem(sys.modules, "user_helpers", module)
    _serialize.dumps((Helper,))  # found by its name: by reference, no fallback
    cloudpickle.register_pickle_by_value(module)  # as bench_runtime.py does itself
    try:
        with pytest.raises(AssertionError, match="fell back"):
            _serialize.dumps((Helper,))
    finally:
        cloudpickle.unregister_pickle_by_value(module)


@pytest.mark.parametrize(
    "tensor",
    [
        torch.arange(24, dtype=torch.float64).reshape(2, 3, 4),
        torch.arange(10000, dtype=torch.bfloat16).reshape(100, 100).t(),  # non-contiguous
        torch.ones(3, 3, dtype=torch.bool),
        torch.zeros(0, 5),
        torch.tensor(3.5),
        torch.randn(2000, requires_grad=True),
        torch.randn(4, dtype=torch.complex64),
        torch.randn(2000, dtype=torch.complex64).conj(),  # a lazy conjugate: resolved on send
        torch.arange(20000, dtype=torch.int32)[5000:],  # a view that starts inside its storage
    ],
    ids=[
        "f64-3d",
        "bf16-transposed",
        "bool",
        "empty",
        "scalar",
        "requires-grad",
        "complex",
        "conj",
        "offset",
    ],
)
def test_tensors_round_trip_exactly(procs4, tensor):
    echo = procs4.slice(procs=1).spawn("tensors", Echo)
    result = echo.echo.call_one(tensor).get(timeout=10)
    assert result.dtype == tensor.dtype
    assert result.shape == tensor.shape
    assert result.requires_grad == tensor.requires_grad
    assert torch.equal(result.detach(), tensor.detach())
    if result.numel() and result.dtype != torch.bool:
        result.detach().add_(1)  # received tensors are writable, without a warning


def test_tensors_cross_the_wire_without_numpy(tmp_path):
    """torch's CPU wheel installs no numpy: tensors still travel, and no rank warns."""
    hidden = tmp_path / "hide_numpy" / "numpy"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text(
        'raise ModuleNotFoundError("numpy is hidden by this test", name="numpy")\n'
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(hidden.parent), str(ROOT), *filter(None, [env.get("PYTHONPATH")])]
    )
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "tensor_round_trip.py")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "numpy on the ranks: ValueMesh({procs: 2}) {0-1: False}" in out.stdout
    assert "tensor round trips ok" in out.stdout
    assert "NumPy" not in out.stdout + out.stderr, "a rank warned about numpy"


def test_sockets_are_private_and_the_key_is_never_on_a_command_line(procs4):
    # Local workers reach the controller over a Unix socket in a 0700 directory.
    address = Controller.get().address
    scheme = {"unix": "unixlink://", "zmq": "ipc://"}[_config.get("link")]
    assert address.startswith(scheme)
    directory = os.path.dirname(address.removeprefix(scheme))
    assert os.stat(directory).st_mode & 0o777 == 0o700
    assert os.stat(directory).st_uid == os.getuid()
    key_hex = procs4._group._key.hex()
    for pid in procs4.pids:
        proc = psutil.Process(pid)
        assert proc.cmdline()[1:] == ["-m", "monarch_nb.worker"]
        assert key_hex not in " ".join(proc.cmdline())
        assert all(key_hex not in v for v in proc.environ().values())
    assert key_hex not in " ".join(psutil.Process(os.getpid()).cmdline())


def test_the_bind_address_can_be_chosen(tmp_path):
    # Another loopback address: proves the option works without leaving loopback.
    import subprocess
    import sys

    script = tmp_path / "bind.py"
    script.write_text(
        "from monarch_nb import Actor, endpoint, this_host\n"
        "from monarch_nb._controller._client import Controller\n"
        "class Echo(Actor):\n"
        "    @endpoint\n"
        "    def echo(self, x):\n"
        "        return x\n"
        "with this_host().spawn_procs(per_host={'procs': 2}) as procs:\n"
        "    stats = Controller.get().stats\n"
        "    echo = procs.spawn('echo', Echo)\n"
        "    before = stats.bytes_digested\n"
        "    data = bytearray(range(256)) * 4096\n"
        "    assert echo.echo.call(data).get().values() == [data, data]\n"
        "    print(Controller.get().address, procs.state, stats.bytes_digested - before)\n"
    )
    env = dict(os.environ, MONARCH_NB_BIND="127.0.0.2")
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr
    address, state, digested = out.stdout.split()
    assert address.startswith("tcp://127.0.0.2:")
    assert state == "running"
    # A plain TCP port protects nothing: the 1 MiB argument was hashed once when
    # it was sent, and each rank's 1 MiB reply once when it was verified.
    assert int(digested) == 3 << 20


def test_bulk_frames_cross_the_private_unix_socket_unhashed(procs4):
    stats = Controller.get().stats
    echo = procs4.spawn("unhashed", Echo)
    tensor = torch.arange(1 << 18, dtype=torch.float32)  # 1 MiB, out of band
    before = stats.snapshot()
    assert all(torch.equal(t, tensor) for t in echo.echo.call(tensor).get(timeout=60).values())
    assert stats.bytes_out_of_band - before.bytes_out_of_band >= 1 << 20
    assert stats.bytes_digested == before.bytes_digested


def test_code_sent_by_value_keeps_its_file_name_and_its_nested_functions_too():
    # pdb and tracebacks on a rank find a notebook cell's lines by the code's file
    # name; cloudpickle alone would rename every code object "<dynamic-code>".
    namespace: dict = {}
    exec(
        compile(
            "def outer():\n    def inner():\n        pass\n    return inner", "<cell-7>", "exec"
        ),
        namespace,
    )
    data, buffers = _serialize.dumps(namespace["outer"])
    outer = _serialize.loads(data, buffers)
    assert outer.__code__.co_filename == "<cell-7>"
    assert outer().__code__.co_filename == "<cell-7>"
