"""Finding 8: without a buffer's token, connections to a buffer owner's server can
neither keep readers out nor be held open; a request seen on the network can be
neither replayed nor altered, and the token never crosses it; readers on the same
host use a Unix socket no other user can reach (see also
test_native.py::test_wrong_token_or_region_is_refused)."""

from __future__ import annotations

import dataclasses
import os
import select
import socket
import stat
import struct
import threading

import pytest
from polling import wait_until

from monarch_nb.native import RDMAAccessError, RDMABuffer, RDMATransferError, _memory, statistics
from monarch_nb.native._transport import REPLY_FORMAT, read_hello, sign_request

FLOOD = 300
PER_PEER = 16  # MAX_UNVERIFIED_PER_PEER in _memory.h
PREAUTH_TIMEOUT_S = 10  # _memory.h


def connect_from(source: str, server: tuple[str, int]) -> socket.socket:
    """A TCP connection from the loopback address ``source``: another "host" here."""
    s = socket.socket()
    s.bind((source, 0))
    s.connect(server)
    return s


def closed_by_server(s: socket.socket) -> bool:
    """True if the server closed ``s`` (what it sent before, its hello, is skipped)."""
    try:
        while chunk := s.recv(64):
            assert len(chunk) <= _memory.HELLO_SIZE
        return True
    except ConnectionResetError:
        return True


def test_idle_connections_neither_keep_readers_out_nor_stay_open():
    data = bytearray(os.urandom(1 << 16))
    buf = RDMABuffer(data)
    by_tcp = RDMABuffer._from_handle(dataclasses.replace(buf._handle, unix=None))
    server = buf._handle.server
    baseline = statistics().server_connections
    # A pending connection from one host, then a flood of idle ones from another.
    bystander = connect_from("127.0.0.3", server)
    assert read_hello(bystander)
    idle = [connect_from("127.0.0.2", server) for _ in range(FLOOD)]
    try:
        out = bytearray(len(data))
        by_tcp.read_into(out, transport="tcp").get(timeout=30)  # a reader gets in
        assert out == data
        # The flooding host keeps at most PER_PEER of its connections: its oldest
        # were closed, and the other host's pending one was not touched.
        wait_until(
            lambda: statistics().server_connections <= baseline + PER_PEER + 2,
            30,
            "the owner to close the flooding host's oldest idle connections",
        )
        closed, _, _ = select.select(idle, [], [], 0)
        assert len(closed) >= FLOOD - PER_PEER
        assert all(closed_by_server(s) for s in idle[: FLOOD - PER_PEER])
        assert not select.select([bystander], [], [], 0)[0], "another host's connection evicted"
        # The rest are closed once they have sent nothing for PREAUTH_TIMEOUT_S,
        # while the reader's own (verified) connection may idle in its pool.
        wait_until(
            lambda: (
                all(closed_by_server(s) for s in select.select(idle, [], [], 0)[0])
                and len(select.select(idle, [], [], 0)[0]) == FLOOD
            ),
            PREAUTH_TIMEOUT_S + 30,
            "the owner to close every connection that never showed a token",
        )
        by_tcp.read_into(out, transport="tcp").get(timeout=30)  # the pooled one still works
    finally:
        for s in [*idle, bystander]:
            s.close()
        buf.drop()


class RecordingProxy:
    """Forwards TCP connections to ``server``, keeping what each side sent; with
    ``flip=("up" or "down", n)`` it inverts the n-th byte of that direction of
    each connection, as an attacker on the path would."""

    def __init__(self, server: tuple[str, int], flip: tuple[str, int] | None = None) -> None:
        self.server = server
        self.flip = flip
        self.sent = bytearray()
        self.received = bytearray()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()
        self.connections: list[socket.socket] = []
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.server)
            self.connections += (client, upstream)
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, up: bool) -> None:
        seen = 0
        flip = self.flip[1] if self.flip and self.flip[0] == ("up" if up else "down") else -1
        try:
            while chunk := bytearray(src.recv(1 << 16)):
                if seen <= flip < seen + len(chunk):
                    chunk[flip - seen] ^= 0xFF
                seen += len(chunk)
                (self.sent if up else self.received).extend(chunk)
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        # shutdown() first: close() alone does not wake a thread blocked in
        # accept(), and the port would go on listening (and forwarding) for the
        # rest of the test session, where a later test's rendezvous port may be.
        for sock in (self.listener, *self.connections):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._acceptor.join(timeout=30)
        for sock in (self.listener, *self.connections):
            sock.close()


def status_of(sock: socket.socket, request: bytes) -> int | None:
    """Send ``request``; the reply's status, or None if the server just closed."""
    sock.sendall(request)
    header = b""
    while len(header) < _memory.REPLY_SIZE:
        chunk = sock.recv(_memory.REPLY_SIZE - len(header))
        if not chunk:
            return None
        header += chunk
    return struct.unpack(REPLY_FORMAT, header)[1]


def test_the_token_never_crosses_the_wire_and_requests_cannot_be_replayed():
    data = bytearray(os.urandom(1 << 20))
    buf = RDMABuffer(data)
    h = buf._handle
    proxy = RecordingProxy(h.server)
    try:
        through = RDMABuffer._from_handle(dataclasses.replace(h, server=proxy.address, unix=None))
        out = bytearray(len(data))
        through.read_into(out, transport="tcp").get(timeout=30)
        assert out == data
        through.write_from(bytearray(b"\x01" * 64), offset=128, transport="tcp").get(timeout=30)
        wire = bytes(proxy.sent)
        assert len(wire) >= 2 * _memory.REQUEST_SIZE
        assert h.token not in wire
        captured = wire[: _memory.REQUEST_SIZE]
        # Replayed on a fresh connection (a new challenge): refused, nothing sent.
        with socket.create_connection(h.server, timeout=10) as s:
            read_hello(s)
            assert status_of(s, captured) == _memory.ST_DROPPED
        with socket.create_connection(h.server, timeout=10) as s:
            challenge = read_hello(s)
            read = sign_request(challenge, h.token, _memory.OP_QUERY, h.region, 7, 0, 64)
            assert status_of(s, read) == _memory.ST_OK
            # The same request again on the same connection: its nonce is spent.
            assert status_of(s, read) == _memory.ST_DROPPED
        with socket.create_connection(h.server, timeout=10) as s:
            challenge = read_hello(s)
            signed = bytearray(
                sign_request(challenge, h.token, _memory.OP_READ, h.region, 1, 0, 64)
            )
            signed[24:32] = (4096).to_bytes(8, "little")  # another offset, same MAC
            assert status_of(s, bytes(signed)) == _memory.ST_DROPPED
        assert data[128:192] == b"\x01" * 64
    finally:
        proxy.close()
        buf.drop()


def test_sealed_copies_hide_the_bytes_and_refuse_altered_ones():
    data = bytearray(os.urandom(3 << 20))
    original = bytes(data)
    buf = RDMABuffer(data, encrypt=True)
    h = buf._handle
    assert h.sealed

    def through(proxy: RecordingProxy) -> RDMABuffer:
        return RDMABuffer._from_handle(dataclasses.replace(h, server=proxy.address, unix=None))

    clear = RecordingProxy(h.server)
    header = _memory.HELLO_SIZE + _memory.REPLY_SIZE  # then the first sealed chunk
    down_flip = RecordingProxy(h.server, flip=("down", header + 500))
    up_flip = RecordingProxy(h.server, flip=("up", _memory.REQUEST_SIZE + 500))
    try:
        out = bytearray(len(data))
        through(clear).read_into(out, transport="tcp").get(timeout=30)
        assert out == data
        update = os.urandom(2 << 20)
        through(clear).write_from(update, transport="tcp").get(timeout=30)
        assert data[: len(update)] == update
        # Neither the buffer's bytes nor the written ones were on the wire in clear.
        assert original[1000:1064] not in clear.received
        assert update[1000:1064] not in clear.sent
        # One byte altered on the way: the read fails, the write lands nothing.
        with pytest.raises(RDMATransferError, match="did not pass its check"):
            through(down_flip).read_into(out, transport="tcp").get(timeout=30)
        before = bytes(data)
        with pytest.raises(RDMATransferError, match="did not pass its check"):
            through(up_flip).write_from(os.urandom(1 << 20), transport="tcp").get(timeout=30)
        assert bytes(data) == before
        # Plain copies from another host are refused; the owner's host reads plainly.
        plain = RDMABuffer._from_handle(dataclasses.replace(h, unix=None, sealed=False))
        with pytest.raises(RDMAAccessError, match="only sealed"):
            plain.read_into(out, transport="tcp").get(timeout=30)
        buf.read_into(out, transport="tcp").get(timeout=30)  # its Unix socket
        assert out == data
    finally:
        for proxy in (clear, down_flip, up_flip):
            proxy.close()
        buf.drop()


def test_another_user_cannot_use_the_local_socket(attacker):
    buf = RDMABuffer(bytearray(4096))
    path = buf._handle.unix
    assert path is not None
    directory = os.path.dirname(path)
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    knock = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n"
        "    s.connect(sys.argv[1])\n"
        "except OSError as e:\n"
        "    print('refused', e.errno); sys.exit()\n"
        "s.settimeout(10)\n"
        "print('greeted' if s.recv(64) else 'closed')\n"
    )
    try:
        # The directory keeps other users out ...
        assert attacker.run(knock, path).stdout.split()[0] == "refused"
        # ... and with it opened up, the server still closes their connection unread.
        os.chmod(directory, 0o755)
        os.chmod(path, 0o777)
        assert attacker.run(knock, path).stdout.strip() == "closed"
        out = bytearray(4096)
        buf.read_into(out).get(timeout=10)  # our own readers still get in
    finally:
        os.chmod(directory, 0o700)
        buf.drop()


def test_a_handle_shows_neither_its_token_nor_the_owners_addresses():
    data = bytearray(4096)
    buf = RDMABuffer(data)
    try:
        handle = buf._handle
        shown = repr(handle) + repr(buf)
        assert handle.token.hex() not in shown
        assert str(handle.address) not in shown
        assert hex(handle.address) not in shown
        assert str(handle.unix) not in shown
    finally:
        buf.drop()
