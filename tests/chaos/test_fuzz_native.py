"""The native data-plane server under hypothesis-generated requests.

tests/test_native.py fuzzes it with a seeded random generator; this adds what
that does not: requests shrunk by hypothesis to a minimal counterexample, with
the right token and every op code, and trailing garbage after a valid header.
The owner is a real rank; it must never serve an out-of-range byte, never
change its memory (no writes are sent with the right token) and stay alive.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable

import pytest
from chaos_actors import Probe
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monarch_nb import this_host

native = pytest.importorskip("monarch_nb.native")
if not native.native_available():
    pytest.skip("the native extension is not built", allow_module_level=True)

from monarch_nb.native import _memory as C  # noqa: E402
from monarch_nb.native._transport import REPLY_FORMAT, read_hello, sign_request  # noqa: E402

SIZE = 4096
U64 = st.integers(0, 2**64 - 1)


@pytest.fixture(scope="module")
def owner():
    procs = this_host().spawn_procs(per_host={"procs": 1}, name="rdma-owner", echo_output=False)
    probe = procs.spawn("probe", Probe)
    buffer = probe.rdma_region.call_one(SIZE).get(timeout=10)
    original = bytearray(SIZE)
    buffer.read_into(original).get(timeout=10)
    yield probe, buffer, bytes(original)
    procs.stop()


def exchange(
    server: tuple[str, int], make: Callable[[bytes], bytes]
) -> tuple[int, int, bytes] | None:
    """Send the request ``make(challenge)`` builds for a fresh connection; the reply's
    (status, value, data that followed), or None."""
    with socket.create_connection(server, timeout=5) as s:
        challenge = read_hello(s)
        try:
            s.sendall(make(challenge))
            s.shutdown(socket.SHUT_WR)
            data = b""
            while chunk := s.recv(1 << 16):
                data += chunk
        except OSError:
            return None  # closed on garbage it had not read yet
    if len(data) < C.REPLY_SIZE:
        assert data == b"", data[:64]
        return None
    magic, status, value = struct.unpack(REPLY_FORMAT, data[: C.REPLY_SIZE])
    assert magic == C.REPLY_MAGIC
    return status, value, data[C.REPLY_SIZE :]


def test_hypothesis_requests_never_escape_the_region(owner):
    probe, buffer, original = owner
    handle = buffer._handle
    edges = st.sampled_from([0, 1, SIZE - 1, SIZE, SIZE + 1, 2**63, 2**64 - 1])

    @settings(
        max_examples=200,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(
        op=st.one_of(
            st.sampled_from([C.OP_READ, C.OP_QUERY, C.OP_READ_SEALED]), st.integers(10, 0xFFFF)
        ),
        right_token=st.booleans(),
        token=st.binary(min_size=16, max_size=16),
        nonce=st.one_of(st.just(1), U64),
        offset=st.one_of(edges, U64),
        length=st.one_of(edges, U64),
        trailing=st.binary(max_size=64),
    )
    def check(op, right_token, token, nonce, offset, length, trailing):
        key = handle.token if right_token else token

        def make(challenge: bytes) -> bytes:
            signed = sign_request(challenge, key, op, handle.region, nonce, offset, length)
            return signed + trailing

        reply = exchange(handle.server, make)
        if reply is None:
            return
        status, value, data = reply
        inside = offset <= SIZE and length <= SIZE - offset
        if status == C.ST_OK:
            assert right_token
            assert nonce > 0
            assert inside
            assert op in (C.OP_READ, C.OP_QUERY, C.OP_READ_SEALED)
            if op == C.OP_READ:
                assert value == length
                assert data == original[offset : offset + length]
            if op == C.OP_READ_SEALED:  # each 1 MiB chunk with its 16-byte tag
                chunks = -(-length // C.SEAL_CHUNK)
                assert len(data) == length + 16 * chunks
                assert original[offset : offset + length] not in data or length < 16

    check()
    copy = bytearray(SIZE)
    buffer.read_into(copy).get(timeout=10)
    assert copy == original
    assert probe.echo.call_one(1).get(timeout=10) == 1
