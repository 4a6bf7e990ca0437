# Signing and checking small control-wire messages in C (see _fastwire.c, _wire.py).
from collections.abc import Sequence
from typing import Any

SMALL_HASH_LIMIT: int
REPLAY_WINDOW: int
FALL_BACK: int
MALFORMED: int
MISDIRECTED: int

def key_state(key: bytes) -> bytes: ...
def digest(body: Any, buffers: Sequence[Any], by_length: bool) -> tuple[bytes, int] | None: ...
def header(state: bytes, sequence: int, flags: int, sender: bytes, digest: bytes) -> bytes: ...
def frame(
    state: bytes, sequence: int, flags: int, sender: bytes, meta: bytes, payload: bytes
) -> bytes: ...
def check(
    state: bytes, frames: Sequence[Any], upstream: bool, trusted: bool, sender: bytes | None
) -> int | tuple[int, bytes, int] | tuple[None, None, int]: ...
def sha_extensions() -> bool: ...

class Window:
    """The sequence numbers already accepted from one sender (_wire.ReplayWindow)."""

    def accept(self, number: int) -> bool: ...
