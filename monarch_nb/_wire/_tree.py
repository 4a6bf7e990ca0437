"""Casts down a tree of host agents: the relay plan's bytes, and the two messages
that open an agent's tree link.

A cast to many hosts leaves the controller as a few messages, one per subtree
root, each with an envelope ``T`` + a *node*: the worker identities this agent
relays to itself, and for each child agent its tree endpoint and the child's
own node (sent on as the child's envelope unchanged, so no level re-encodes
what is below it). The message after the envelope is the controller's, signed
for the workers; no agent can change it without the workers refusing it.

A node, big-endian::

    u32 n_workers, then each: u16 length, identity
    u32 n_children, then each: u16 length, endpoint; u32 length, node

A malformed node raises :class:`ValueError` (its reader drops the message).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from ._messages import Message, _message

# The envelope of a cast that an agent relays to its workers and to child agents
# (beside _signed.RELAY, its workers only, and _signed.OWN, its own message).
TREE = b"T"
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


@_message
@dataclass(frozen=True, slots=True)
class TreeListen(Message):
    """Controller to agent: open your tree link (a CURVE endpoint that only this
    host mesh's agents can connect to) and say where it is."""

    TAG: ClassVar[int] = 200


@_message
@dataclass(frozen=True, slots=True)
class TreeListening(Message):
    """Agent to controller: its tree link's endpoint ("" and ``error`` if it
    could not open one)."""

    TAG: ClassVar[int] = 201
    endpoint: str
    error: str


def encode_node(workers: Sequence[bytes], children: Sequence[tuple[bytes, bytes]]) -> bytes:
    """A node: ``workers`` (identities) and ``children`` ((endpoint, node) each)."""
    parts = [_U32.pack(len(workers))]
    for identity in workers:
        parts += (_U16.pack(len(identity)), identity)
    return with_children(parts, children)


def with_children(parts: list[bytes], children: Sequence[tuple[bytes, bytes]]) -> bytes:
    """A node's bytes: ``parts`` (its workers, as its kind of node writes them),
    then ``children`` ((endpoint, node) each), as every kind of node ends."""
    parts.append(_U32.pack(len(children)))
    for endpoint, node in children:
        parts += (_U16.pack(len(endpoint)), endpoint, _U32.pack(len(node)), node)
    return b"".join(parts)


def parse_node(data: bytes | memoryview) -> tuple[list[bytes], list[tuple[bytes, bytes]]]:
    """``(workers, children)`` of a node made by :func:`encode_node`; ValueError if
    it is not one (truncated, or bytes left over)."""
    read = NodeReader(data, "a tree relay's node")
    workers = [read.short_bytes() for _ in range(read.u32())]
    return workers, read.children()


class NodeReader:
    """A node's fields, in order, each checked against the end of ``data``;
    ValueError naming ``what`` was read if it is truncated or runs on."""

    __slots__ = ("_at", "_view", "_what")

    def __init__(self, data: bytes | memoryview, what: str) -> None:
        self._view = memoryview(data)
        self._at = 0
        self._what = what

    def take(self, n: int) -> memoryview:
        at = self._at
        if at + n > len(self._view):
            raise ValueError(f"{self._what} is truncated at byte {at}")
        self._at = at + n
        return self._view[at : at + n]

    def u32(self) -> int:
        return int(_U32.unpack(self.take(4))[0])

    def short_bytes(self) -> bytes:
        """Bytes after their u16 length (an identity, an endpoint)."""
        return bytes(self.take(_U16.unpack(self.take(2))[0]))

    def children(self) -> list[tuple[bytes, bytes]]:
        """The node's children ((endpoint, node) each), which end it: ValueError if
        bytes are left after them."""
        children = []
        for _ in range(self.u32()):
            endpoint = self.short_bytes()
            children.append((endpoint, bytes(self.take(self.u32()))))
        if self._at != len(self._view):
            raise ValueError(f"{self._what} has {len(self._view) - self._at} bytes after its end")
        return children
