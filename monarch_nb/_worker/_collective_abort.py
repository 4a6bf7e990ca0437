"""A collective that failed on this rank lets the ranks waiting on it go at once.

When a rank of a gloo process group dies, its neighbours' collectives fail at
once (their connections to it close). A survivor that waits only on another
survivor, one that has already left the collective with that error, is not so
lucky: gloo keeps the other survivor's connections open, even after that one
aborts or destroys its group, so it waits out the whole collective timeout (60 s
by default) before its cell can end, and so does the restart or resize that
needs it. A process group in which a collective failed on its transport cannot
be used again anyway (restarting the lost ranks sets it up afresh on every
rank), so the rank whose collective failed shuts down that group's connections
and aborts it: the ranks waiting on it fail at once too, and so on around the
ring.
"""

from __future__ import annotations

import sys

from .._services._dist import shut_process_group_sockets

# What gloo's transport says when a peer's connection broke; its messages
# name their source, .../gloo/transport/tcp/pair.cc.
_TRANSPORT_ERRORS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Read error",
    "Write error",
)


def _transport_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from or during) is a broken gloo pair."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        try:
            text = str(current)
        except Exception:  # a user exception whose __str__ raises: not gloo's
            text = ""
        if "gloo/transport/" in text and any(marker in text for marker in _TRANSPORT_ERRORS):
            return True
        current = current.__cause__ or current.__context__
    return False


def release_peers_after(exc: BaseException) -> bool:
    """If ``exc`` says a collective's transport broke, shut down and abort this
    rank's default gloo process group; whether it did. Never raises: the call's
    own failure is what its caller must see."""
    dist = sys.modules.get("torch.distributed")  # only if user code imported it
    if dist is None or not _transport_failure(exc):
        return False
    try:
        if not dist.is_initialized() or dist.get_backend() != "gloo":
            return False
        shut_process_group_sockets()
        dist.distributed_c10d._abort_process_group()
    except Exception:  # an older torch without abort: its timeout frees them
        return False
    return True
