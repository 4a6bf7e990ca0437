"""Which frames are the worker's own, not the user's.

A failure's traceback leaves them out, a status's stack waits for the main
thread to leave them for the work it has begun, and ``%mesh why`` names the
innermost frame of an awaiting call that is not one of them.
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(__file__)

# The modules the main thread passes through between the wire and user code.
DISPATCH_FILES = frozenset(
    os.path.join(_HERE, name)
    for name in ("_main.py", "_inbox.py", "_running.py", "_actors.py", "_cells.py", "_answers.py")
)
# Where a failure's traceback starts: the dispatch, a cell's exec, an async call's steps.
TRACEBACK_SKIPPED = DISPATCH_FILES | frozenset(
    os.path.join(_HERE, name) for name in ("_namespace.py", "_endpoint_tasks.py")
)
# Frames of waiting on a future (where a nested call's error was re-raised), and
# of the actor that applies ProcMesh.map's function: ours, not the user's.
WAIT_FILES = frozenset(
    os.path.join(os.path.dirname(_HERE), layer, name)
    for layer, name in (
        ("_model", "_future.py"),
        ("_runtime", "_pending.py"),
        ("_runtime", "_balance.py"),
    )
)

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def not_user_code(filename: str) -> bool:
    """Frames that say nothing of where user code awaits: monarch_nb's, asyncio's."""
    if filename.startswith(_PACKAGE_DIR):
        return True
    asyncio = sys.modules.get("asyncio")  # loaded: a call awaits
    where = getattr(asyncio, "__file__", None)
    return where is not None and filename.startswith(os.path.dirname(where))
