"""Replies folded on the way up: a reduced cast's envelope, the partial folds
agents send up, and the one kind of reply payload an agent unpickles.

A reduced call (``Accumulator(ep, 0, "sum")``) leaves the controller once per
subtree root (or once per host, without a tree) with the envelope ``F`` +
head + *node*: the head is the call id and the reducer, and the node the
agent's own workers with their ranks and, per child agent, its tree endpoint
and the child's own node (sent on after ``F`` + the same head; nodes do not
change from call to call to the same ranks, so the controller keeps them)::

    head: u64 call id, u8 reducer (``_model._reducers.CODES``)
    node: u32 n_workers, then each: u32 rank, u16 length, identity
          u32 n_children, then each: u16 length, endpoint; u32 length, node

Each agent folds its workers' replies and its children's partial folds into
one :class:`~.._model._reducers.Partial`, and sends it to its parent agent
(on the tree link, a frame ``U`` + call id, then the partial's JSON; CURVE
with the host mesh's agent key pair authenticates both ends) or, at a root,
to the controller as :class:`FoldedReply`, signed with the agent's key like
everything else it says. Partials are JSON, never pickles.

A rank's reply the agent cannot fold (a failure, a value that is not a
number, one with out-of-band buffers) goes up unchanged on the agent's link,
as every reply did before, and the partial names the rank as ``passed``; a
rank whose process exited before it replied is ``lost`` (its agent reports
the exit as ever, and the call fails with it).
"""

from __future__ import annotations

import io
import pickle
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ._messages import Message, _message
from ._signed import _split
from ._tree import NodeReader, with_children

FOLD = b"F"  # a reduced cast's envelope (beside RELAY, OWN and _tree.TREE)
UP = b"U"  # a child agent's partial fold, on the tree link
_HEAD = struct.Struct(">QB")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_CALL = struct.Struct(">Q")


@_message
@dataclass(frozen=True, slots=True)
class FoldedReply(Message):
    """Agent to controller: its subtree's replies to call ``call_id`` folded
    (``partial``: JSON), but for ``passed`` ranks (their replies came up
    unchanged) and ``lost`` ranks (they exited before replying)."""

    TAG: ClassVar[int] = 202
    call_id: int
    partial: bytes
    passed: tuple[int, ...]
    lost: tuple[int, ...]


@dataclass
class Plan:
    head: bytes  # call id and reducer, as the envelope has them
    call_id: int
    reducer: int
    workers: list[tuple[int, bytes]]  # (rank, identity)
    children: list[tuple[bytes, bytes]]  # (tree endpoint, the child's node)


def head(call_id: int, reducer: int) -> bytes:
    return _HEAD.pack(call_id, reducer)


def encode_node(
    workers: Sequence[tuple[int, bytes]], children: Sequence[tuple[bytes, bytes]]
) -> bytes:
    parts = [_U32.pack(len(workers))]
    for rank, identity in workers:
        parts += (_U32.pack(rank), _U16.pack(len(identity)), identity)
    return with_children(parts, children)


def parse_plan(data: bytes | memoryview) -> Plan:
    """Head and node of an envelope after its ``F``; ValueError if not one."""
    read = NodeReader(data, "a reduced cast's plan")
    head_bytes = bytes(read.take(_HEAD.size))
    call_id, reducer = _HEAD.unpack(head_bytes)
    workers = []
    for _ in range(read.u32()):
        rank = read.u32()
        workers.append((rank, read.short_bytes()))
    return Plan(head_bytes, call_id, reducer, workers, read.children())


def up_frame(call_id: int) -> bytes:
    return UP + _CALL.pack(call_id)


def parse_up(frame: bytes) -> int:
    """The call id of a ``U`` frame; ValueError if it is not one."""
    if len(frame) != 1 + _CALL.size or not frame.startswith(UP):
        raise ValueError("not a partial fold's frame")
    return int(_CALL.unpack(frame[1:])[0])


class _NoGlobals(pickle.Unpickler):
    """Unpickles plain data only: looking up any class or function is refused, so
    nothing but ints, floats, bools, strings, bytes, None and containers of them
    can come out (no constructor, no code)."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


_NOT_PLAIN = object()


def plain_payload(frames: Sequence[Any]) -> Any:
    """The payload of a verified message if it is plain data without buffers
    (the value of a rank's reply); else :data:`NOT_PLAIN`. Only for messages
    whose signature was checked: this is still an unpickle, of plain data only."""
    split = _split(frames)
    if split is None:
        return _NOT_PLAIN
    _, body, buffers = split
    if buffers:
        return _NOT_PLAIN
    payload = body[4 + int.from_bytes(body[:4], "little") :]
    if payload.nbytes == 0:
        return None
    try:
        return _NoGlobals(io.BytesIO(payload)).load()
    except Exception:
        return _NOT_PLAIN


NOT_PLAIN = _NOT_PLAIN
