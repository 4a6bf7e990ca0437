"""How a rank answers the work it takes: a value, or a failure, on the message's route.

A message from the controller is answered on the worker's own link
(:class:`ControllerRoute`); one from a peer (an actor elsewhere calling ours)
back to its sender (:class:`PeerRoute`). A broadcast has no caller: its
failure goes to supervision, the controller.
"""

from __future__ import annotations

import dataclasses
import sys
import traceback
from typing import Any, Protocol

from .._model._errors import RemoteError, RemoteFailure
from .._runtime._peer import PeerRoute
from .._wire._messages import BroadcastFailure, Failure, Value
from .._wire._serialize import dumps
from .._wire._signed import Signer, decode_payload
from ._collective_abort import release_peers_after
from ._frames import TRACEBACK_SKIPPED, WAIT_FILES
from ._wire_thread import WireThread

# Frames a failure's traceback leaves out, wherever they are in it: the
# dispatch's (the SIGINT handler raising KeyboardInterrupt is the last frame of
# an interrupt) and waiting on a future's.
_SKIPPED_IN_STACK = TRACEBACK_SKIPPED | WAIT_FILES

# to_wire(Value(call_id)) is (_VALUE_TAG, call_id): a reply's meta without the
# message object (a frozen dataclass, an interpreted __init__ and to_wire's two frames).
_VALUE_TAG = Value.TAG


class ControllerRoute:
    """Replies to the controller's messages go back on the worker's own link."""

    __slots__ = ("send", "send_encoded", "send_small", "signer")

    def __init__(self, wire: WireThread, signer: Signer) -> None:
        self.send = wire.send
        self.send_encoded = wire.send_encoded
        self.send_small = wire.send_small
        self.signer = signer


Route = ControllerRoute | PeerRoute


class Failed:
    """Stands in for a payload that could not be unpickled (already reported)."""


FAILED = Failed()


class _Ranked(Protocol):
    """The worker, as answers name it: its rank now (a resize changes it)."""

    rank: int


class Answers:
    """Answers calls for one worker: replies, failures, undecodable arguments."""

    def __init__(self, worker: _Ranked, controller_route: ControllerRoute) -> None:
        self._worker = worker
        self.controller_route = controller_route
        self._send = controller_route.send
        # actor id -> the supervision port of whoever spawned it through a
        # reference (see _runtime/_peer_supervision): its broadcasts' failures go there.
        self.supervisors: dict[int, Any] = {}

    def reply_value(self, call_id: int, value: Any, route: Route | None = None) -> None:
        route = route or self.controller_route
        try:
            # As Signer.encode pickles it (None: no payload bytes at all).
            payload, buffers = dumps(value, by_value=False) if value is not None else (b"", [])
            message = None
            if buffers:  # frames beside the body (tensors, arrays): encoded as ever
                message = route.signer.encode_pickled(Value(call_id), payload, buffers)
        except Exception as exc:
            failure = RemoteFailure(
                self._worker.rank,
                type(value).__name__,
                f"the return value ({type(value).__name__}) cannot be pickled: {exc}",
                "",
            )
            route.send(Failure(call_id, failure, True))
            return
        if message is None:  # most replies: a small value, sealed and sent in one step
            if route.send_small((_VALUE_TAG, call_id), payload):
                return
            message = route.signer.encode_pickled(Value(call_id), payload, buffers)
        route.send_encoded(message)

    def failure_of(self, exc: BaseException) -> RemoteFailure:
        """``exc`` as its caller sees it: the user's frames of its traceback."""
        # First, so that ranks waiting on this one in a broken collective go now.
        release_peers_after(exc)
        # Kept where pdb.pm() looks, for post-mortem debugging on the rank.
        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in TRACEBACK_SKIPPED:
            tb = tb.tb_next
        summary = traceback.TracebackException(type(exc), exc, tb)
        summary.stack = traceback.StackSummary.from_list(
            # Dispatch frames inside user code too: the SIGINT handler raising
            # KeyboardInterrupt is the last frame of an interrupt.
            [f for f in summary.stack if f.filename not in _SKIPPED_IN_STACK]
        )
        text = "".join(summary.format())
        if isinstance(exc, RemoteError):  # a call this actor made failed: show where
            text += f"--- {exc.target} was called from here, and failed:\n{exc.render()}\n"
        try:
            message = str(exc)
        except Exception as broken:  # a user exception whose __str__ raises
            message = f"<str() of the exception failed: {type(broken).__name__}: {broken}>"
        return RemoteFailure(self._worker.rank, type(exc).__name__, message, text)

    def report(
        self,
        call_id: int,
        reply: bool,
        actor_id: int,
        label: str,
        failure: RemoteFailure,
        route: Route | None = None,
        *,
        serialization: bool = False,
    ) -> None:
        """Answer call ``call_id`` with ``failure``; a broadcast's goes to supervision."""
        if reply:
            (route or self.controller_route).send(Failure(call_id, failure, serialization))
        else:  # a broadcast has no caller: supervision takes it
            supervisor = self.supervisors.get(actor_id)
            if supervisor is not None:  # the actor that spawned it, not our controller
                try:
                    supervisor.send((label, failure))
                    return
                except Exception as exc:  # unreachable: the controller hears of it instead
                    failure = dataclasses.replace(
                        failure,
                        message=f"{failure.message} (its supervisor was unreachable: {exc})",
                    )
            self._send(BroadcastFailure(actor_id, label, failure))

    def decode_or_fail(
        self,
        call_id: int,
        reply: bool,
        label: str,
        frames: list[Any],
        actor_id: int = 0,
        route: Route | None = None,
    ) -> Any:
        """The payload of ``frames``, or :data:`FAILED` once its failure is answered."""
        try:
            return decode_payload(frames)
        except Exception as exc:
            self.undecodable(exc, call_id, reply, label, actor_id, route)
            return FAILED

    def undecodable(
        self,
        exc: Exception,
        call_id: int,
        reply: bool,
        label: str,
        actor_id: int = 0,
        route: Route | None = None,
    ) -> RemoteFailure:
        """Answer a message whose arguments raised ``exc`` when unpickled; returns
        the failure answered."""
        failure = RemoteFailure(
            self._worker.rank,
            type(exc).__name__,
            f"the arguments could not be unpickled: {type(exc).__name__}: {exc} "
            "(is the module that defines them importable on the workers?)",
            "",
        )
        self.report(call_id, reply, actor_id, label, failure, route, serialization=True)
        return failure
