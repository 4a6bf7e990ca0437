"""What the roles of a process group share: the group, as each role sees it.

A :class:`~._process_group.ProcGroup` is composed of roles, each a class with
the state it owns: :class:`~._launcher.Launcher`, :class:`~._worker_messages.
WorkerMessages`, :class:`~._rank_output.RankOutput`, :class:`~._liveness.Liveness`
and :class:`~._restarts.Restarter`. A role holds the group it serves, typed by
:class:`GroupCore` (the group's shared state, and the entry points through
which roles call each other), so no role imports the group's module or another
role's.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ._group_protocol import HostedGroup, SendingGroup

if TYPE_CHECKING:
    from .._model._errors import MeshFailure, SpawnError
    from .._model._shape import Shape
    from .._wire._messages import Message
    from .._wire._signed import Encoded, Signer
    from ._client import Controller
    from ._events import EventStream, RankState
    from ._hosts import HostAgents
    from ._lifecycle import SpawnRecord, State
    from ._recovery import RestartBudget, RestartPolicy
    from ._status import RestartRecord
    from ._telemetry import TelemetryHistory
    from ._workers import LocalWorker, WorkerProcess


class GroupCore(SendingGroup, HostedGroup, Protocol):
    """A process group's shared state and the calls its roles make on each other
    (and what the lower layers need of it: a role hands the group on to them)."""

    # Who and where (set at creation).
    uid: str
    name: str
    shape: Shape
    controller: Controller
    agents: HostAgents | None
    extra_env: dict[str, str]
    boot_extras: dict[str, Any]
    gpus: bool
    owner: Any  # the actor that supervises the group, or None
    events: EventStream
    telemetry: TelemetryHistory
    restart_policy: RestartPolicy | None
    after_restart: list[Callable[[tuple[int, ...]], None]]
    resized_into: str | None
    debugger: object | None

    # This generation's processes (see ProcGroup.__init__).
    state: State
    generation: int
    heartbeat_s: float
    workers: list[WorkerProcess]
    signer: Signer
    _key: bytes
    _env: dict[str, str]
    all_ready: threading.Event
    ready_ranks: set[int]
    hosts: dict[int, str]
    peer_addresses: dict[int, str]
    inboxes: dict[int, str]
    rank_failures: dict[int, str]
    idle_since: dict[int, float]
    paused: set[int]
    dead: dict[int, MeshFailure]
    restarting: set[int]
    actor_failures: dict[int, MeshFailure]
    init_failures: dict[int, SpawnError]
    spawned: dict[int, SpawnRecord]
    missing_actors: dict[int, dict[int, str]]

    @property
    def successor(self) -> GroupCore | None: ...

    # Settings, read at use (config.configure() changes them).
    @property
    def start_timeout_s(self) -> float: ...

    @property
    def configured_heartbeat_s(self) -> float: ...

    @property
    def stop_grace_s(self) -> float: ...

    @property
    def worker_imports(self) -> list[str]: ...

    def new_debugger(self) -> object | None: ...

    # The routing checks the group answers itself.
    def encode(self, message: Message, payload: Any = None) -> Encoded: ...

    def failure_for(self, ranks: tuple[int, ...]) -> MeshFailure | None: ...

    def rank_failure(self, ranks: tuple[int, ...]) -> MeshFailure | None: ...

    def note_failure(self, rank: int, cause: str) -> None: ...

    def rank_state(self, rank: int) -> RankState: ...

    # The roles' entry points, through the group.
    def start(self) -> None: ...

    def launch(
        self, rank: int, identity: bytes, key: bytes, base_env: dict[str, str]
    ) -> LocalWorker: ...

    def watch_one(self, w: LocalWorker) -> None: ...

    def read_output(self, worker: WorkerProcess, stream: str, pipe: Any) -> None: ...

    def drain_output(self, worker: LocalWorker) -> None: ...

    def on_exit(self, worker: LocalWorker) -> None: ...

    def fail(self, error: MeshFailure) -> None: ...

    def kill(self) -> None: ...

    def stop(self, grace: float | None = None) -> None: ...

    def forget(self, workers: list[WorkerProcess]) -> None: ...

    def end_ranks(
        self, ranks: tuple[int, ...], error: MeshFailure, mark: Callable[[], None]
    ) -> int: ...

    def notify_restart(self) -> None: ...

    def schedule_restart(self, ranks: tuple[int, ...], cause: str) -> None: ...

    @property
    def restart_budget(self) -> RestartBudget | None: ...

    @property
    def restart_failed(self) -> dict[int, str]: ...

    @property
    def replacing_all(self) -> bool: ...

    @property
    def restarts(self) -> deque[RestartRecord]: ...
