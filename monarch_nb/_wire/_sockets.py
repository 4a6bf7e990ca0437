"""The wire's per-message socket operations: on libzmq directly where the C
extension :mod:`._fastzmq` is built, else (or where libzmq says no) pyzmq.

pyzmq costs a few microseconds around every libzmq call it makes (argument
parsing, a ``Frame`` object per part, ``ZMQ_EVENTS`` looked up as an enum
member first), and a no-op call crossed it a dozen times. :mod:`._fastzmq`
works on the very libzmq functions pyzmq calls (looked up through pyzmq's own
compiled backend, opened with ``RTLD_NOLOAD``: never a second copy), on the socket's handle
(``zmq.Socket.underlying``), and never waits or raises libzmq's errors: where
libzmq refuses (a full queue, a closed context) it says how far it got, and
pyzmq does the rest, waiting, raising and handling signals as it always did.

``MONARCH_NB_PURE_PYTHON_WIRE=1`` turns off this module's C and
:mod:`._fastwire`'s (the tests run meshes mixing both ways).
"""

from __future__ import annotations

from typing import Any

import zmq

from ._extensions import load_extension
from ._unix_link import LinkRouter, is_link

_EVENTS = int(zmq.EVENTS)
_SNDMORE = int(zmq.SNDMORE)
# take()'s status: the socket said nothing waits; a budget is spent; libzmq refused.
DRAINED, BUDGET_SPENT, ASK_PYZMQ = 0, 1, 2


def _pyzmq_extension() -> str | None:
    """The file of pyzmq's compiled backend, whose libzmq is the one to call: its
    own dependency (pip's wheels ship it beside pyzmq) or linked into it."""
    import zmq.backend

    if zmq.backend.Socket.__module__ != "zmq.backend.cython._zmq":
        return None  # another backend in use (CFFI, PyPy): pyzmq does it all
    from zmq.backend.cython import _zmq

    return getattr(_zmq, "__file__", None)


def _bind() -> Any:
    fast = load_extension("_fastzmq")
    if fast is None:
        return None
    path = _pyzmq_extension()
    return fast if path is not None and fast.bind(path) else None


_fastzmq = _bind()


def socket_events(socket: zmq.Socket) -> int:
    """``ZMQ_EVENTS`` of ``socket`` (through pyzmq, which raises, if libzmq refuses)."""
    if is_link(socket):
        return socket.events()
    if _fastzmq is not None and not socket.closed:
        events = _fastzmq.events(socket.underlying)
        if events >= 0:
            return events
    return int(socket.getsockopt(_EVENTS))


def take(
    socket: zmq.Socket,
    partial: list[Any] | None,
    dropping: bool,
    frames: int,
    messages: int,
    max_per_message: int,
) -> tuple[list[list[Any]], list[Any] | None, bool, int, int] | None:
    """Whole messages off ``socket`` in C, as :class:`._wire.Receiver` takes them:
    ``(done, partial, dropping, dropped, status)``; status 0: the socket said
    nothing waits, 1: a budget is spent, 2: libzmq refused (ask pyzmq). None
    where the C path is unavailable. A zmq socket only: the receiver asks a
    Unix link itself."""
    assert not is_link(socket), "a Unix link takes its own messages (Receiver.take)"
    if _fastzmq is None or socket.closed:
        return None
    return _fastzmq.take(socket.underlying, partial, dropping, frames, messages, max_per_message)


def send_copied(socket: zmq.Socket, parts: list[Any]) -> int:
    """Send the parts of one message (small frames, copied) without waiting; how
    many libzmq took: the caller sends the rest through pyzmq."""
    if is_link(socket):  # copied: the link may queue them
        socket.send_parts([p if p.__class__ is bytes else bytes(p) for p in parts])
        return len(parts)
    if _fastzmq is None or socket.closed:
        return 0
    sent: int = _fastzmq.send_copied(socket.underlying, parts)
    return sent


def send_one(socket: zmq.Socket, frame: bytes) -> int:
    """Send the one-frame message ``frame`` (copied) and return the socket's
    ``ZMQ_EVENTS`` after it: in C, else through pyzmq, waiting or raising as it does."""
    if is_link(socket):
        socket.send_parts([bytes(frame)])
        return socket.events()
    if _fastzmq is not None and not socket.closed:
        events: int = _fastzmq.send_one(socket.underlying, frame)
        if events >= 0:
            return events
        if events == -2:  # sent: only the look after it failed
            return int(socket.getsockopt(_EVENTS))
    socket.send(frame, 0)
    return socket_events(socket)


def send_each_copied(socket: zmq.Socket, identities: list[bytes], frame: bytes) -> None:
    """Send the one-frame message ``frame`` to each of ``identities`` (a ROUTER's
    cast): in C, then through pyzmq from where libzmq stopped, waiting or raising
    as pyzmq does."""
    if isinstance(socket, LinkRouter):
        socket.send_frame(identities, frame if frame.__class__ is bytes else bytes(frame))
        return
    if is_link(socket):
        frame = bytes(frame)
        for identity in identities:
            socket.send_parts([identity, frame])
        return
    start = 0
    if _fastzmq is not None and not socket.closed:
        start = _fastzmq.send_each_copied(socket.underlying, identities, frame)
        if start < 0:  # the identity part of message -start - 1 went, not its frame
            socket.send(frame, 0)
            start = -start
    for identity in identities[start:]:
        socket.send(identity, _SNDMORE)
        socket.send(frame, 0)
