"""Finding 8: without a buffer's token, connections to a buffer owner's server
can neither keep readers out nor be held open; a wrong token tells a prober
nothing (see also test_native.py::test_wrong_token_or_region_is_refused)."""

from __future__ import annotations

import os
import select
import socket

from polling import wait_until

from monarch_nb.native import RDMABuffer, statistics

FLOOD = 300
MAX_UNVERIFIED = 64  # _memory.c
PREAUTH_TIMEOUT_S = 10  # _memory.c


def test_idle_connections_neither_keep_readers_out_nor_stay_open():
    data = bytearray(os.urandom(1 << 16))
    buf = RDMABuffer(data)
    host, port = buf._handle.server
    baseline = statistics().server_connections
    idle = [socket.create_connection((host, port)) for _ in range(FLOOD)]
    try:
        # More idle connections than the old cap allowed in all: a reader gets in.
        out = bytearray(len(data))
        buf.read_into(out, transport="tcp").get(timeout=30)
        assert out == data
        # The owner holds at most MAX_UNVERIFIED of them: the oldest were closed.
        wait_until(
            lambda: statistics().server_connections <= baseline + MAX_UNVERIFIED + 1,
            30,
            "the owner to close the oldest idle connections",
        )
        closed, _, _ = select.select(idle, [], [], 0)
        assert len(closed) >= FLOOD - MAX_UNVERIFIED
        assert all(s.recv(1) == b"" for s in closed)
        # The rest are closed once they have sent nothing for PREAUTH_TIMEOUT_S,
        # while the reader's own (verified) connection may idle in its pool.
        wait_until(
            lambda: len(select.select(idle, [], [], 0)[0]) == FLOOD,
            PREAUTH_TIMEOUT_S + 30,
            "the owner to close every connection that never showed a token",
        )
        buf.read_into(out, transport="tcp").get(timeout=30)  # the pooled one still works
    finally:
        for s in idle:
            s.close()
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
    finally:
        buf.drop()
