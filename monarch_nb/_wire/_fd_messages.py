"""JSON messages with file descriptors attached (``SCM_RIGHTS``), over a
datagram or seqpacket Unix socket: the zygote's socketpair, read by both its
ends (``_services._zygote`` and ``_worker._zygote``)."""

from __future__ import annotations

import array
import json
import os
import socket
from typing import Any


def receive(
    sock: socket.socket, max_bytes: int, max_fds: int
) -> tuple[dict[str, Any], list[int]] | None:
    """One message of at most ``max_bytes`` and the descriptors that came with
    it (at most ``max_fds``), now this process's to close; None when the other
    end has closed (any descriptors with that end closed here). Raises
    ``OSError`` as ``recvmsg`` does."""
    data, ancillary, _flags, _addr = sock.recvmsg(
        max_bytes, socket.CMSG_SPACE(max_fds * array.array("i").itemsize)
    )
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            received = array.array("i")
            # A truncated control message may end mid-descriptor: whole ones only.
            received.frombytes(payload[: len(payload) - len(payload) % received.itemsize])
            fds.extend(received)
    if not data:
        for fd in fds:
            os.close(fd)
        return None
    return json.loads(data), fds
