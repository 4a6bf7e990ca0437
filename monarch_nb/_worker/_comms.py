"""Jupyter comms opened on a rank (ipywidgets, ``tqdm.notebook`` bars), relayed.

A rank has no kernel, so ``comm.create_comm`` would hand ipywidgets a comm
that goes nowhere. Once ``comm`` is imported on a rank (by ipywidgets), its
factory makes :class:`RankComm`\\ s instead: every message one publishes goes to
the controller as a ``CommFromRank``, and the notebook's kernel opens a comm of
the same id there and forwards both ways (``monarch_nb.magics``). What the
notebook sends back (a slider moved, a button clicked) arrives as a
``CommToRank``, handled on the rank's main thread between its messages, as a
kernel handles comm messages between cells.

Nothing here imports ``comm`` or ipywidgets: a rank that never makes a widget
never loads them.
"""

from __future__ import annotations

import logging
import sys
import traceback
from typing import Any

from .._wire._messages import CommFromRank, CommToRank
from . import _rich

_worker: Any = None  # the rank's Worker, once a cell ran


def install(worker: Any) -> None:
    """Relay the comms this process opens through ``worker``'s controller."""
    global _worker
    _worker = worker
    worker.wire.control_handlers[CommToRank] = _arrived
    _rich.when_imported("comm", _patch)


def _patch(module: Any) -> None:
    if getattr(module.create_comm, "_monarch_nb", False):
        return

    def create_comm(*args: Any, **kwargs: Any) -> Any:
        return _comm_class()(*args, **kwargs)

    create_comm._monarch_nb = True  # type: ignore[attr-defined]
    module.create_comm = create_comm
    # ipywidgets catches what a widget's handler (an observer) raises and, with
    # no IPython shell to show it, logs it with its traceback on traitlets'
    # logger, which has only a NullHandler: without this it would vanish.
    logger = logging.getLogger("traitlets")
    if not any(isinstance(h, _CurrentStderr) for h in logger.handlers):
        logger.addHandler(_CurrentStderr(logging.WARNING))


class _CurrentStderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time: a cell's output, or the
    rank's own output (its log) between cells."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.setLevel(level)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass  # always the current sys.stderr


_RankComm: Any = None


def _comm_class() -> Any:
    """:class:`comm.base_comm.BaseComm` with a ``publish_msg`` that sends to the
    controller (defined on first use: ``comm`` is imported by then)."""
    global _RankComm
    if _RankComm is None:
        from comm.base_comm import BaseComm

        class RankComm(BaseComm):
            def publish_msg(
                self,
                msg_type: str,
                data: Any = None,
                metadata: Any = None,
                buffers: Any = None,
                **keys: Any,
            ) -> None:
                worker = _worker
                if worker is None:
                    return
                payload = {
                    "data": data or {},
                    "metadata": metadata or {},
                    "buffers": [bytes(b) for b in buffers or ()],
                }
                target = keys.get("target_name") or ""
                worker.send(CommFromRank(msg_type, self.comm_id, target), payload)

        _RankComm = RankComm
    return _RankComm


def _arrived(message: Any) -> None:
    """Wire thread: hand the notebook's message to the main thread."""
    if _worker is not None:
        _worker.post(lambda: _deliver(message))


def _deliver(message: CommToRank) -> None:
    """Main thread: run the comm's handlers; what they raise is printed on stderr
    (into the cell's output, or the rank's log), as a kernel does."""
    try:
        _handle(message)
    except Exception:
        traceback.print_exc()


def _handle(message: CommToRank) -> None:
    import comm

    target = comm.get_comm_manager().get_comm(message.comm_id)
    if target is None:
        return  # closed here meanwhile
    msg = {
        "header": {"msg_type": message.msg_type},
        "parent_header": {},
        "metadata": {},
        "content": {"comm_id": message.comm_id, "data": message.data},
        "buffers": [memoryview(b) for b in message.buffers],
    }
    if message.msg_type == "comm_close":
        target._closed = True  # closed by the notebook: nothing to send back
        comm.get_comm_manager().unregister_comm(target)
        target.handle_close(msg)
    else:
        target.handle_msg(msg)
