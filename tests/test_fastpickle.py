"""The C look for large bytes (monarch_nb._wire._fastpickle) against the Python one.

``_serialize.dumps`` wraps large bytes to send them out of band only when the
C look says ``_wrap_large_bytes`` would find some: both must agree on every
object, or a large bytes would travel in-band (slow, never wrong) or a wrap
would be skipped that the Python path makes. And the C copy a large received
bytes is made by: the same type and value as ``bytes(frame)``, on huge pages
when it is large.
"""

import importlib.util
import io
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monarch_nb._wire import _serialize

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("monarch_nb._wire._fastpickle") is None,
    reason="monarch_nb._wire._fastpickle was not built",
)

THRESHOLD = 8  # small, so examples reach it: the rules do not depend on the size


class BytesKind(bytes):
    """A bytes subclass: the pickler asks reducer_override for it, so it is not wrapped."""


leaves = st.one_of(
    st.integers(),
    st.text(max_size=12),
    st.none(),
    st.binary(max_size=12),
    st.binary(max_size=12).map(bytearray),
    st.binary(max_size=12).map(BytesKind),
)
objects = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(st.integers(), inner, max_size=4),
        st.dictionaries(st.binary(min_size=THRESHOLD, max_size=12), inner, max_size=2),
    ),
    max_leaves=24,
)


def test_the_c_look_is_in_use_where_it_was_built():
    assert _serialize._holds_large_bytes is not None


@settings(max_examples=400, deadline=None)
@given(objects)
def test_the_c_look_agrees_with_the_python_wrap(obj):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_serialize, "OUT_OF_BAND_THRESHOLD", THRESHOLD)
        wraps = _serialize._wrap_large_bytes(obj) is not obj
    assert _serialize._holds_large_bytes(obj, _serialize._WRAP_DEPTH, THRESHOLD) is wraps


def test_the_depth_and_the_size_are_the_python_ones():
    big = b"x" * THRESHOLD
    look = _serialize._holds_large_bytes
    assert look(big, 0, THRESHOLD)
    assert not look(big[:-1], 3, THRESHOLD)
    assert look(bytearray(big), 3, THRESHOLD)
    assert look([[[big]]], 3, THRESHOLD)
    assert not look([[[[big]]]], 3, THRESHOLD)  # deeper ones go in-band, as in Python
    assert look({"k": (big,)}, 3, THRESHOLD)
    assert not look({big: 1}, 3, THRESHOLD)  # keys are not looked at
    assert not look(BytesKind(big), 3, THRESHOLD)
    assert not look(memoryview(big), 3, THRESHOLD)


def test_large_bytes_inside_a_big_container_still_travel_out_of_band():
    payload = ([0] * 1000 + [bytes(1 << 20)], {})
    body, buffers = _serialize.dumps(payload)
    assert len(body) < 16_384  # 1,000 small ints, but not the MiB
    assert [memoryview(b).nbytes for b in buffers] == [1 << 20]
    args, _ = _serialize.loads(body, [bytearray(b.raw()) for b in buffers])
    assert args[-1] == bytes(1 << 20)


# -- plain values: pickle.dumps without our pickler ---------------------------------

plain_leaves = st.one_of(
    st.integers(), st.floats(allow_nan=False), st.text(max_size=12), st.none(), st.booleans()
)
plain_objects = st.recursive(
    plain_leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(st.text(max_size=4), inner, max_size=4),
    ),
    max_leaves=24,
)


class Point:
    """An instance: the pickler asks reducer_override for it, so it is never plain."""

    def __init__(self, x: int) -> None:
        self.x = x


@settings(max_examples=300, deadline=None)
@given(plain_objects)
def test_a_plain_value_pickles_to_the_bytes_our_pickler_writes(obj):
    assert _serialize._is_plain(obj, _serialize._PLAIN_DEPTH)
    for by_value in (True, False):
        body, buffers = _serialize.dumps(obj, by_value=by_value)
        stream = io.BytesIO()
        pickler = _serialize._GuardedPickler if by_value else _serialize._FastPickler
        pickler(stream, protocol=5).dump(obj)
        assert (body, buffers) == (stream.getvalue(), [])
        assert _serialize.loads(body) == obj


def test_what_is_not_plain_goes_through_our_pickler():
    look = _serialize._is_plain
    assert look(((), {}), 8)
    assert look(((1, "a", 2.5, b"raw", None, True), {"k": [3]}), 8)
    for value in (
        Point(1),
        [Point(1)],
        {Point(1): 1},  # keys are looked at too
        BytesKind(b"x"),
        bytearray(b"x"),
        1 + 2j,
        {1, 2},
        int,  # a class: by reference or by value, the pickler decides
        memoryview(b"x"),
    ):
        assert not look(value, 8), value
    cycle: list = []
    cycle.append(cycle)
    assert not look(cycle, 8)  # deeper than the bound: the pickler's memo handles it
    assert not look([[[1]]], 2)
    assert look([[[1]]], 3)


def test_a_class_from_main_inside_a_plain_looking_container_still_goes_by_value():
    # Not plain (a class), so the guarded pickler sees it and falls back to cloudpickle.
    Local = type("Local", (), {"__module__": "__main__"})
    body, _ = _serialize.dumps(([Local], {}))
    assert _serialize.loads(body)[0][0].__name__ == "Local"


def test_pickling_loads_its_c_look_without_the_socket_layer():
    # Layering: _serialize gets its extension through _extensions, not _sockets
    # (which imports zmq), so pickling needs no socket library.
    probe = (
        "import sys; from monarch_nb._wire import _serialize; "
        "print(_serialize._is_plain is not None, 'zmq' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["True", "False"]


# -- loading: the copy a received large bytes is made by ---------------------------


def _vm_flags_at(address: int) -> list[str]:
    """The ``VmFlags`` of the mapping of this process that holds ``address``."""
    with open("/proc/self/smaps") as smaps:
        inside = False
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                start, end = (int(part, 16) for part in head.split("-"))
                inside = start <= address < end
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.parametrize("kind", [bytes, bytearray])
def test_received_bytes_keep_their_type_and_value_at_every_size(kind):
    for size in (0, 1, 4096, 1 << 20, 33 << 20):
        data = kind(range(256)) * (size // 256) + kind(size % 256)
        body, buffers = _serialize.dumps(([data], {}))
        if size >= _serialize.OUT_OF_BAND_THRESHOLD:
            assert [memoryview(b).nbytes for b in buffers] == [size]
        # As frames arrive: read-only memory, which the copy must not share.
        frames = [memoryview(bytes(b.raw())) for b in buffers]
        (args, _) = _serialize.loads(body, frames)
        assert type(args[0]) is kind
        assert args[0] == data


def test_the_copy_refuses_what_is_not_one_contiguous_buffer():
    copy_buffer = _serialize._copy_buffer
    assert copy_buffer(memoryview(b"abc")[1:], False) == b"bc"
    assert copy_buffer(b"xy", True) == bytearray(b"xy")
    with pytest.raises(TypeError):
        copy_buffer("text", False)
    with pytest.raises(BufferError, match="contiguous"):
        copy_buffer(memoryview(bytes(8))[::2], False)


@pytest.mark.skipif(
    not os.path.exists("/sys/kernel/mm/transparent_hugepage"),
    reason="transparent huge pages are a Linux feature this kernel does not have",
)
def test_a_large_received_bytes_is_asked_onto_huge_pages():
    # Filling 64 MiB of fresh small pages took 16,384 page faults, about as long
    # as the copy: the copy asks for huge pages first (the mapping's "hg" flag).
    import ctypes

    big = _serialize._copy_buffer(memoryview(bytes(64 << 20)), False)
    middle = ctypes.cast(ctypes.c_char_p(big), ctypes.c_void_p).value + (32 << 20)
    assert "hg" in _vm_flags_at(middle)
    small = _serialize._copy_buffer(memoryview(bytes(1 << 20)), False)
    start = ctypes.cast(ctypes.c_char_p(small), ctypes.c_void_p).value
    assert "hg" not in _vm_flags_at(start)  # the heap's pages: left as they are
