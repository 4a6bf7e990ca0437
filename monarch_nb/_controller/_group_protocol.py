"""What the lower layers of the controller need of a process group, as protocols.

The controller's modules stack up: stacks and diagnosis, then interrupts, then
sending calls, then the client (the socket), then host agents, and the
:class:`~._process_group.ProcGroup` on top. A lower module only names the
group it is handed, so it names it by one of these protocols (what it uses,
nothing more) and never imports the group's module.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .._model._errors import MeshFailure
    from .._model._future import Future
    from .._model._shape import Shape
    from .._runtime._pending import PendingCall
    from .._wire._messages import Message, StatusReply
    from .._wire._signed import Encoded, Signer
    from ._events import EventStream
    from ._io_loop import IOLoop
    from ._lifecycle import SpawnRecord, State
    from ._timeline import TimelineRecorder
    from ._workers import WorkerProcess


class StackedGroup(Protocol):
    """A group whose ranks' stacks are read (:mod:`._stacks`, :mod:`._diagnose`)."""

    @property
    def name(self) -> str: ...

    @property
    def workers(self) -> Sequence[WorkerProcess]: ...

    def query(self, ranks: tuple[int, ...]) -> Future[dict[int, StatusReply]]: ...

    def end_query(self, future: Future[dict[int, StatusReply]]) -> dict[int, StatusReply]: ...


class LoopOwner(Protocol):
    @property
    def loop(self) -> IOLoop: ...


class InterruptibleGroup(StackedGroup, Protocol):
    """A group whose calls are stopped (:mod:`._interrupt`)."""

    @property
    def controller(self) -> LoopOwner: ...

    def interrupt(self, ranks: Iterable[int], call_id: int = 0) -> None: ...

    def kill_ranks(self, ranks: Iterable[int], why: str | None = None) -> None: ...


class ClientGroup(Protocol):
    """A group as the controller's client sends to it and dispatches for it (:mod:`._client`)."""

    state: State

    @property
    def id(self) -> int: ...

    @property
    def name(self) -> str: ...

    @property
    def signer(self) -> Signer: ...

    @property
    def events(self) -> EventStream: ...

    @property
    def timeline(self) -> TimelineRecorder: ...

    @property
    def rank_failures(self) -> dict[int, str]: ...

    @property
    def idle_since(self) -> dict[int, float]: ...

    def failure_for(self, ranks: tuple[int, ...]) -> MeshFailure | None: ...

    @property
    def spawned(self) -> dict[int, SpawnRecord]: ...

    def routes(self, ranks: tuple[int, ...]) -> list[tuple[bytes | None, list[bytes]]]: ...

    def fold_routes(self, ranks: tuple[int, ...], call: Any) -> list[tuple[bytes | None, Any]]: ...

    def note_failure(self, rank: int, cause: str) -> None: ...

    def rank_settled(self, rank: int) -> None: ...

    def on_worker_message(self, rank: int, message: Message, frames: list[Any]) -> None: ...

    # The controller's table of groups (``Controller.groups``) ends them: killed at
    # exit, stopped by ``shutdown_context()``.
    def kill(self) -> None: ...

    def stop(self, grace: float | None = None) -> None: ...


class CallSender(Protocol):
    """The controller as :func:`._calls.send_call` uses it."""

    def next_call_id(self) -> int: ...

    def send(
        self,
        group: ClientGroup,
        ranks: Iterable[int],
        message: Encoded,
        call: PendingCall | None = None,
        *,
        even_if_failed: bool = False,
    ) -> None: ...


class SendingGroup(ClientGroup, Protocol):
    """A group a call is sent to (:mod:`._calls`)."""

    @property
    def controller(self) -> CallSender: ...


class HostedGroup(Protocol):
    """A group whose workers host agents run (:mod:`._hosts`)."""

    workers: list[WorkerProcess]

    @property
    def id(self) -> int: ...

    @property
    def name(self) -> str: ...

    @property
    def shape(self) -> Shape: ...

    @property
    def gpus(self) -> bool: ...

    @property
    def extra_env(self) -> dict[str, str]: ...

    @property
    def hosts(self) -> dict[int, str]: ...

    def stop(self, grace: float | None = None) -> None: ...

    def on_output(self, worker: WorkerProcess, stream: str, chunk: bytes) -> None: ...

    def output_ended(self, worker: WorkerProcess, stream: str) -> None: ...

    def worker_exited(self, worker: WorkerProcess) -> None: ...

    def host_lost(self, workers: list[WorkerProcess], host: str, why: str) -> None: ...
