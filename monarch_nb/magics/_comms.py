"""ipywidgets made on ranks, shown in the notebook: a comm relay.

A widget a rank makes (``ipywidgets.IntSlider()``, the bar of
``tqdm.notebook``) opens a comm there (``monarch_nb._worker._comms``), whose
messages reach this kernel as ``CommMessage`` events. For each, the relay
opens a comm of the same id here, so the frontend's widget manager builds the
model, and the rank's ``display(widget)`` (a view naming that id, relayed as
any display) renders it in the cell. Updates flow on: the rank's state
changes as ``comm_msg``\\ s out, the frontend's (a slider moved) back to the
rank. This is what ipyparallel does with its engines' comms.

Events arrive in the order the rank sent them, one at a time to every
observer, so a comm is open here before the display that shows it.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from .._controller._events import CommMessage, RanksRestarted
from .._wire._messages import CommToRank

_log = logging.getLogger(__name__)


class CommRelay:
    """The comms of one mesh's ranks, mirrored in this kernel."""

    def __init__(self, procs: Any) -> None:
        self._group = procs._group
        self._lock = threading.Lock()
        self._comms: dict[str, tuple[int, Any]] = {}  # comm id -> (rank, this kernel's comm)
        self.subscription = procs.events.subscribe(
            self.on_event, kinds=(CommMessage, RanksRestarted)
        )

    def close(self) -> None:
        """Stop relaying, and close the comms a rank left open (their widgets go)."""
        self.subscription.close()
        with self._lock:
            comms, self._comms = list(self._comms.values()), {}
        for _, comm in comms:
            comm.close()

    def drop(self, ranks: set[int]) -> None:
        """Close the comms of ``ranks``: their processes were replaced, and the
        new ones know nothing of those widgets."""
        with self._lock:
            gone = [cid for cid, (rank, _) in self._comms.items() if rank in ranks]
            comms = [self._comms.pop(cid)[1] for cid in gone]
        for comm in comms:
            comm.close()

    # -- I/O thread -----------------------------------------------------------------

    def on_event(self, event: CommMessage | RanksRestarted) -> None:
        try:
            if isinstance(event, RanksRestarted):
                self.drop(set(event.ranks))
                return
            self._relay(event)
        except Exception:  # a frontend that cannot take it: the rank carries on
            _log.exception("monarch_nb: could not relay a rank's comm message")

    def _relay(self, event: CommMessage) -> None:
        buffers = list(event.buffers) or None
        if event.msg_type == "comm_open":
            self._open(event, buffers)
            return
        with self._lock:
            known = self._comms.get(event.comm_id)
            if event.msg_type == "comm_close":
                self._comms.pop(event.comm_id, None)
        if known is None:
            return
        comm = known[1]
        if event.msg_type == "comm_close":
            comm.close(event.data, event.metadata, buffers)
        else:
            comm.send(event.data, event.metadata, buffers)

    def _open(self, event: CommMessage, buffers: list[bytes] | None) -> None:
        import comm as jupyter_comm

        opened = jupyter_comm.create_comm(
            target_name=event.target_name,
            data=event.data,
            metadata=event.metadata,
            buffers=buffers,
            comm_id=event.comm_id,
        )
        rank, comm_id = event.rank, event.comm_id

        def to_rank(msg: dict[str, Any]) -> None:  # the kernel's shell thread
            data = msg.get("content", {}).get("data", {})
            blobs = tuple(bytes(b) for b in msg.get("buffers") or ())
            self._group.send_comm(rank, CommToRank(comm_id, "comm_msg", data, blobs))

        def closed(msg: dict[str, Any]) -> None:
            with self._lock:
                known = self._comms.pop(comm_id, None) is not None
            if known:  # closed by the frontend, not relayed from the rank
                self._group.send_comm(rank, CommToRank(comm_id, "comm_close", {}, ()))

        opened.on_msg(to_rank)
        opened.on_close(closed)
        with self._lock:
            self._comms[comm_id] = (rank, opened)
