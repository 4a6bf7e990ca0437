"""What a group's workers say besides a call's reply: hellos, heartbeats, and relays.

Status replies answer :meth:`WorkerMessages.query`; pdb prompts and widget comm
messages are relayed both ways (the prompt side, ``monarch_nb.debug``, and the
notebook's comms observe the group's events).
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any

from .._model._errors import MeshFailure, RemoteError
from .._model._future import Future
from .._runtime import _context
from .._runtime._peer_supervision import failed_actor_text
from .._wire._messages import (
    BroadcastFailure,
    CommFromRank,
    CommToRank,
    DebugEnded,
    DebugInput,
    DebugOutput,
    DebugPrompt,
    DebugRefused,
    Display,
    Heartbeat,
    Hello,
    Message,
    ProtocolError,
    StatusQuery,
    StatusReply,
    Supervision,
)
from .._wire._signed import decode_payload
from . import _events as ev
from ._actor_failures import point_in, qualified, with_ranks_of
from ._group_core import GroupCore
from ._lifecycle import Running, Starting

_log = logging.getLogger("monarch_nb")
NO_DEBUGGER = (
    "breakpoint() on a rank needs a debugger prompt on the controller, and none is "
    "attached: in a notebook run %load_ext monarch_nb before %mesh start; in a script "
    "call monarch_nb.debug.install() before spawn_procs()"
)


class WorkerMessages:
    """Handles a group's worker messages (I/O thread) and sends the relays back."""

    def __init__(self, group: GroupCore) -> None:
        self._group = group
        self._queries: dict[int, tuple[Future[Any], dict[int, StatusReply], int]] = {}
        self._query_ids = itertools.count(1)

    def on_worker_message(self, rank: int, message: Message, frames: list[Any]) -> None:
        """A worker's message other than a call's reply (I/O thread)."""
        match message:
            case Hello(_, host, peer):
                # may come before _watch() lists the workers; an agent's host name wins
                self._group.hosts.setdefault(rank, host)
                if peer:
                    self._group.peer_addresses[rank] = peer
                self._group.ready_ranks.add(rank)
                if self._group.events.observed:
                    self._group.events.emit(
                        ev.RankStateChanged(self._group.name, rank, ev.RankState.IDLE)
                    )
                if len(self._group.ready_ranks) == len(self._group.shape) and isinstance(
                    self._group.state, Starting
                ):
                    self._group.state = Running()
                    self._group.all_ready.set()
                if rank in self._group.restarting:
                    self._group.notify_restart()
            case Heartbeat(sample, work, work_seconds, metrics):
                if rank >= len(self._group.workers):
                    return  # still starting: the next one will do
                worker = self._group.workers[rank]
                before = worker.heartbeat[1] if worker.heartbeat else None
                self._group.telemetry.add_heartbeat(rank, sample, before, metrics)
                worker.previous_heartbeat = worker.heartbeat
                worker.heartbeat = (time.monotonic(), sample)
                worker.work, worker.work_seconds = work, work_seconds
                if self._group.events.observed:
                    self._group.events.emit(
                        ev.Heartbeat(self._group.name, rank, sample, work, work_seconds)
                    )
            case BroadcastFailure(actor_id, label, failure):
                actor, _, endpoint = label.partition(".")
                error = RemoteError([failure], actor=actor, endpoint=endpoint)
                record = self._group.spawned.get(actor_id)
                which = f"actor mesh {record.name!r}" if record is not None else "this actor mesh"
                failed = MeshFailure(
                    failed_actor_text(label, failure, which, error),
                    ranks=(rank,),
                    cause=error,
                    mesh=self._group.name,
                    actor=record.name if record is not None else actor,
                    actor_class=qualified(record.cls) if record is not None else None,
                    point=point_in(record, rank) if record is not None else None,
                )
                self._group.actor_failures[actor_id] = with_ranks_of(
                    self._group.actor_failures.get(actor_id), failed
                )
                _log.error("monarch_nb: %s", failed)
                self._group.note_failure(rank, f"{failure.type_name}: {failure.message}")
                # Up the supervision tree, as a mesh failure: the owner's
                # __supervise__, or the unhandled_fault_hook.
                _context.report_child_failure(self._group.owner, failed)
                if self._group.events.observed:
                    self._group.events.emit(
                        ev.RankFailed(
                            self._group.name,
                            rank,
                            f"{failure.type_name}: {failure.message}",
                            traceback=failure.traceback,
                            label=label,
                        )
                    )
            case Display():
                try:
                    payload = decode_payload(frames)
                except Exception as exc:
                    payload = {"data": {"text/plain": f"<display failed: {exc!r}>"}}
                if self._group.events.observed and isinstance(payload, dict):
                    data, metadata = payload.get("data"), payload.get("metadata") or {}
                    if isinstance(data, dict) and isinstance(metadata, dict):
                        self._group.events.emit(
                            ev.DisplayData(self._group.name, rank, data, metadata)
                        )
            case CommFromRank(msg_type, comm_id, target_name):
                self._on_comm(rank, msg_type, comm_id, target_name, frames)
            case StatusReply():
                self._on_status_reply(rank, message)
            case Supervision(text):
                self._group.fail(
                    MeshFailure(
                        f"rank {rank} of {self._group.name!r} reported an unhandled "
                        f"failure: {text}",
                        ranks=(rank,),
                        cause=text,
                    )
                )
            case DebugPrompt() | DebugOutput() | DebugEnded():
                self._on_debug(rank, message)
            case ProtocolError(detail):
                _log.error("monarch_nb: rank %d of %r: %s", rank, self._group.name, detail)
            case _:
                _log.error(
                    "monarch_nb: rank %d of %r sent %s, which a controller does not handle",
                    rank,
                    self._group.name,
                    type(message).__name__,
                )

    def _on_debug(self, rank: int, message: DebugPrompt | DebugOutput | DebugEnded) -> None:
        # The prompt side (monarch_nb.debug) observes these events. Without one the
        # rank would wait for input forever, so it is told to raise instead.
        if self._group.debugger is None:
            debugger = self._group.new_debugger()
            if debugger is None:
                if isinstance(message, DebugPrompt):
                    self.send_debug(rank, DebugRefused(NO_DEBUGGER))
                return
            self._group.debugger = debugger
        match message:
            case DebugPrompt(prompt, location):
                self._group.paused.add(rank)
                self._group.timeline.paused(rank)  # not slow: waiting for a person
                self._group.events.emit(
                    ev.RankStateChanged(self._group.name, rank, ev.RankState.PAUSED, location)
                )
                self._group.events.emit(ev.DebuggerPaused(self._group.name, rank, prompt, location))
            case DebugOutput(text):
                self._group.events.emit(ev.DebuggerOutput(self._group.name, rank, text))
            case DebugEnded(how):
                self._group.paused.discard(rank)
                self._group.timeline.resumed(rank)
                self._group.events.emit(ev.DebuggerResumed(self._group.name, rank, how))
                self._group.events.emit(
                    ev.RankStateChanged(self._group.name, rank, ev.RankState.BUSY, how)
                )

    def _on_comm(
        self, rank: int, msg_type: str, comm_id: str, target_name: str, frames: list[Any]
    ) -> None:
        if not (self._group.events.observed and self._group.events.wants(ev.CommMessage)):
            return  # nobody relays comms (a script): the rank's widget talks to nobody
        try:
            payload = decode_payload(frames)
            data, metadata = dict(payload["data"]), dict(payload["metadata"])
            buffers = tuple(bytes(b) for b in payload["buffers"])
        except Exception as exc:
            _log.error(
                "monarch_nb: rank %d of %r sent a comm message: %r", rank, self._group.name, exc
            )
            return
        self._group.events.emit(
            ev.CommMessage(
                self._group.name, rank, msg_type, comm_id, target_name, data, metadata, buffers
            )
        )

    def send_comm(self, rank: int, message: CommToRank) -> None:
        """Hand the notebook's message to a comm that ``rank`` opened (any thread)."""
        if self._group.workers[rank].returncode is None:
            self._group.controller.send(self._group, (rank,), self._group.encode(message))

    def send_debug(self, rank: int, message: DebugInput | DebugRefused) -> None:
        """Answer ``rank``'s pdb prompt (any thread); sent even to a failed mesh, whose
        other ranks may still be paused."""
        if self._group.workers[rank].returncode is None:
            self._group.controller.send(
                self._group, (rank,), self._group.encode(message), even_if_failed=True
            )

    def query(self, ranks: tuple[int, ...]) -> Future[dict[int, StatusReply]]:
        """Ask ``ranks`` what their main thread runs, with its stack (answered by the
        wire thread, busy or not)."""
        future: Future[dict[int, StatusReply]] = Future._new()
        live = tuple(r for r in ranks if self._group.workers[r].returncode is None)
        if not live:
            future.set_result({})
            return future
        query_id = next(self._query_ids)
        self._queries[query_id] = (future, {}, len(live))
        message = self._group.signer.encode(StatusQuery(query_id))
        self._group.controller.send(self._group, live, message, even_if_failed=True)
        return future

    def end_query(self, future: Future[dict[int, StatusReply]]) -> dict[int, StatusReply]:
        """Give up on a query: the replies that did arrive (the rest never will)."""
        for query_id, (pending, replies, _) in list(self._queries.items()):
            if pending is future:
                del self._queries[query_id]
                return dict(replies)
        return future.get(timeout=0) if future.done() else {}

    def _on_status_reply(self, rank: int, reply: StatusReply) -> None:
        entry = self._queries.get(reply.query_id)
        if entry is None:
            return
        future, replies, expected = entry
        replies[rank] = reply
        if len(replies) == expected:
            del self._queries[reply.query_id]
            future.set_result(replies)
