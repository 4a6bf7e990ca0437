"""Every message the controller and a worker exchange, one frozen dataclass each.

On the wire a message is its ``TAG`` followed by its fields, a plain tuple
(the ``meta`` of :mod:`._wire`); a payload (arguments, a return value, a
cell's source) travels beside it, pickled separately, so the receiver can
always tell which call a message belongs to even when the payload cannot be
unpickled. Receivers turn the tuple back into its class with
:func:`from_wire` and handle it with ``match``. An unknown tag raises
:class:`UnknownMessage`, which receivers count and report: nothing is
dropped silently.

Adding a kind is one dataclass here (a new ``TAG``) and one ``case`` where it
is handled.

Controller -> worker::

    Spawn, Call, RunCell, Push, Pull   work, run in order on the main thread
                                       (Spawn and Call also from other actors,
                                       through the peer layer, :mod:`._peer`)
    Renumber                           work too: the rank's new place after a resize
    PortSend                           a value for a port (peers too)
    StopActor, Shutdown                work too (ordered after the calls before them)
    Interrupt, StatusQuery             control, answered by the wire thread at once
    DebugInput, DebugRefused           control, for a rank stopped in pdb (monarch_nb.debug)
    CommToRank                         control: the notebook's message to a rank's comm

Worker -> controller::

    Hello, Value, Failure, BroadcastFailure, Display, CommFromRank, Supervision,
    Heartbeat (with a ResourceSample), StatusReply, ProtocolError,
    DebugPrompt, DebugOutput, DebugEnded
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from operator import attrgetter
from types import MemberDescriptorType
from typing import Any, ClassVar

from .._model._errors import RemoteFailure


class UnknownMessage(ValueError):
    """A verified message whose tag or field count no receiver knows."""


@dataclass(frozen=True, slots=True)
class Message:
    TAG: ClassVar[int] = -1


_BY_TAG: dict[int, tuple[type[Message], int]] = {}
_FIELDS: dict[type[Message], Any] = {}
# Tag -> (class, its fields' slot descriptors, in order): how _fastwire.admit builds
# a received message without its interpreted __init__ (the same object: a frozen
# dataclass's __init__ only sets each field). Only classes whose __init__ does no
# more than that (no __post_init__, every field in __init__ and a slot) are here.
BUILDABLE: dict[int, tuple[type[Message], tuple[Any, ...]]] = {}


def _message(cls: type[Message]) -> type[Message]:
    if cls.TAG in _BY_TAG:
        raise AssertionError(f"message tag {cls.TAG} is used twice")
    names = [f.name for f in fields(cls)]
    _BY_TAG[cls.TAG] = (cls, len(names))
    slots = tuple(cls.__dict__.get(name) for name in names)
    if (
        not hasattr(cls, "__post_init__")
        and all(f.init for f in fields(cls))
        and all(isinstance(slot, MemberDescriptorType) for slot in slots)
    ):
        BUILDABLE[cls.TAG] = (cls, slots)
    if not names:
        _FIELDS[cls] = lambda _msg: ()
    elif len(names) == 1:
        one = attrgetter(names[0])
        _FIELDS[cls] = lambda msg: (one(msg),)
    else:
        _FIELDS[cls] = attrgetter(*names)
    return cls


def to_wire(message: Message) -> tuple[Any, ...]:
    """``(TAG, field, ...)``: what :mod:`._wire` pickles as the meta."""
    return (message.TAG, *_FIELDS[type(message)](message))


def from_wire(meta: Any) -> Message:
    """The message a verified meta tuple stands for; raises :class:`UnknownMessage`."""
    if not isinstance(meta, tuple) or not meta:
        raise UnknownMessage(f"a message must be a non-empty tuple, got {type(meta).__name__}")
    known = _BY_TAG.get(meta[0])
    if known is None:
        raise UnknownMessage(f"unknown message tag {meta[0]!r}")
    cls, count = known
    if len(meta) - 1 != count:
        raise UnknownMessage(f"{cls.__name__} has {count} fields, got {len(meta) - 1}")
    return cls(*meta[1:])


# -- controller -> worker: work, run in order on the worker's main thread ------------


@_message
@dataclass(frozen=True, slots=True)
class Spawn(Message):
    """Construct an actor (payload: ``(cls, args, kwargs)``)."""

    TAG: ClassVar[int] = 1
    call_id: int
    actor_id: int
    name: str
    labels: tuple[str, ...]
    sizes: tuple[int, ...]
    ranks: tuple[int, ...]


@_message
@dataclass(frozen=True, slots=True)
class Call(Message):
    """Call an endpoint (payload: ``(args, kwargs)``); ``reply`` False for a broadcast.

    ``sent_to`` is ``(labels, sizes, ranks)`` of the slice the call was sent to,
    so the callee knows its ``message_rank``; empty when it went to the whole
    actor mesh (the point is then the actor's own).
    """

    TAG: ClassVar[int] = 2
    call_id: int
    actor_id: int
    endpoint: str
    reply: bool
    sent_to: tuple[Any, ...] = ()


@_message
@dataclass(frozen=True, slots=True)
class RunCell(Message):
    """Run a code cell in the rank's namespace (payload: the source)."""

    TAG: ClassVar[int] = 3
    call_id: int
    filename: str


@_message
@dataclass(frozen=True, slots=True)
class Push(Message):
    """Set names in the rank's namespace (payload: a dict)."""

    TAG: ClassVar[int] = 4
    call_id: int


@_message
@dataclass(frozen=True, slots=True)
class Pull(Message):
    """Reply with one name of the rank's namespace."""

    TAG: ClassVar[int] = 5
    call_id: int
    name: str


@_message
@dataclass(frozen=True, slots=True)
class StopActor(Message):
    """Stop an actor: its async calls unwind, then its ``__cleanup__`` runs; then,
    if ``call_id``, the process answers ``Value(call_id)`` (the stop's future)."""

    TAG: ClassVar[int] = 6
    actor_id: int
    call_id: int = 0


@_message
@dataclass(frozen=True, slots=True)
class Shutdown(Message):
    TAG: ClassVar[int] = 7


@_message
@dataclass(frozen=True, slots=True)
class Renumber(Message):
    """The rank moved into a resized mesh (payload: its new ``rank``, the mesh's
    ``labels`` and ``sizes``, the ``env`` to set, and the new ``ref``)."""

    TAG: ClassVar[int] = 9
    call_id: int


@_message
@dataclass(frozen=True, slots=True)
class PortSend(Message):
    """A value (payload) for port ``port_id`` of the receiving process; with
    ``is_error`` the payload is an exception the receiver raises."""

    TAG: ClassVar[int] = 8
    port_id: int
    is_error: bool


# -- controller -> worker: control, handled on the worker's wire thread at once -------


@_message
@dataclass(frozen=True, slots=True)
class Interrupt(Message):
    """Stop call ``call_id`` on the rank: KeyboardInterrupt if it runs, answered as
    interrupted without running if still queued. ``0``: whatever user code runs now."""

    TAG: ClassVar[int] = 20
    call_id: int = 0


@_message
@dataclass(frozen=True, slots=True)
class StatusQuery(Message):
    """Ask what the main thread is doing, with its Python stack."""

    TAG: ClassVar[int] = 21
    query_id: int


# -- worker -> controller -------------------------------------------------------------


@_message
@dataclass(frozen=True, slots=True)
class Hello(Message):
    """A worker is up; ``peer`` is where other hosts reach its inbox (if they may)."""

    TAG: ClassVar[int] = 40
    pid: int
    host: str
    peer: str = ""


@_message
@dataclass(frozen=True, slots=True)
class Value(Message):
    """A call's result (payload: the value; none for a spawn)."""

    TAG: ClassVar[int] = 41
    call_id: int


@_message
@dataclass(frozen=True, slots=True)
class Failure(Message):
    """A call raised (or its value or arguments could not cross the wire)."""

    TAG: ClassVar[int] = 42
    call_id: int
    failure: RemoteFailure
    serialization: bool


@_message
@dataclass(frozen=True, slots=True)
class BroadcastFailure(Message):
    """A broadcast raised: nobody waits for it, so supervision takes it."""

    TAG: ClassVar[int] = 43
    actor_id: int
    label: str
    failure: RemoteFailure


@_message
@dataclass(frozen=True, slots=True)
class Display(Message):
    """Rich output of ``display()`` on a rank (payload: ``{"data", "metadata"}``)."""

    TAG: ClassVar[int] = 44


@_message
@dataclass(frozen=True, slots=True)
class CommFromRank(Message):
    """A Jupyter comm a rank opened (ipywidgets), a message on it, or its close
    (payload: ``{"data", "metadata", "buffers"}``): relayed to the notebook."""

    TAG: ClassVar[int] = 52
    msg_type: str  # "comm_open", "comm_msg" or "comm_close"
    comm_id: str
    target_name: str  # for "comm_open"


@_message
@dataclass(frozen=True, slots=True)
class Supervision(Message):
    """An actor did not handle the failure of a mesh it spawned."""

    TAG: ClassVar[int] = 45
    message: str


@dataclass(frozen=True, slots=True)
class ResourceSample:
    """What a rank uses, sampled by its wire thread (plain data)."""

    cpu_seconds: float  # user + system CPU time of the process so far
    rss_bytes: int
    sampled_at: float = 0.0  # the rank's monotonic clock: CPU % is a slope over it
    gpu_memory_allocated: int | None = None  # torch.cuda, when the rank initialised CUDA
    gpu_memory_reserved: int | None = None
    gpu_utilization: float | None = None  # percent, from NVML when available


@_message
@dataclass(frozen=True, slots=True)
class Heartbeat(Message):
    """Sent by the wire thread every heartbeat interval, busy or not."""

    TAG: ClassVar[int] = 46
    sample: ResourceSample
    work: str  # what the main thread runs now ("" when idle)
    work_seconds: float  # for how long
    # log_metric() points since the last one: (wall clock, name, value, step)
    metrics: tuple[tuple[float, str, float, int | None], ...] = ()


AWAITING_HEADING = "async endpoint calls awaiting ("


@_message
@dataclass(frozen=True, slots=True)
class StatusReply(Message):
    TAG: ClassVar[int] = 47
    query_id: int
    work: str
    work_seconds: float
    # The main thread's Python stack, innermost last; then, after AWAITING_HEADING,
    # one line per async endpoint call waiting at an await, and where.
    stack: str
    # torch.distributed collectives the default process group has issued (its
    # sequence number), or -1 when torch.distributed is not in use.
    collectives: int = -1


@_message
@dataclass(frozen=True, slots=True)
class ProtocolError(Message):
    """The worker received a verified message it could not interpret."""

    TAG: ClassVar[int] = 48
    detail: str


# -- the debugger bridge (monarch_nb.debug) ----------------------------------------
# Controller -> worker, control: the rank's main thread is inside pdb waiting for a
# line, so the wire thread hands these over (WireThread.control_handlers).


@_message
@dataclass(frozen=True, slots=True)
class DebugInput(Message):
    """One line typed at the ``(Pdb rank N)`` prompt."""

    TAG: ClassVar[int] = 22
    line: str


@_message
@dataclass(frozen=True, slots=True)
class DebugRefused(Message):
    """Nobody can answer the rank's prompt: its breakpoint raises ``reason``."""

    TAG: ClassVar[int] = 23
    reason: str


@_message
@dataclass(frozen=True, slots=True)
class CommToRank(Message):
    """What the notebook sent to a comm a rank opened (a slider moved), or its close."""

    TAG: ClassVar[int] = 24
    comm_id: str
    msg_type: str  # "comm_msg" or "comm_close"
    data: Any
    buffers: tuple[bytes, ...]


# Worker -> controller.


@_message
@dataclass(frozen=True, slots=True)
class DebugPrompt(Message):
    """The rank is paused in pdb and reads a line (``location``: ``file:line in func``)."""

    TAG: ClassVar[int] = 49
    prompt: str
    location: str


@_message
@dataclass(frozen=True, slots=True)
class DebugOutput(Message):
    """Text pdb wrote on the rank."""

    TAG: ClassVar[int] = 50
    text: str


@_message
@dataclass(frozen=True, slots=True)
class DebugEnded(Message):
    """The rank left pdb (``how``: "continued", "quit", "interrupted", "refused: ...")."""

    TAG: ClassVar[int] = 51
    how: str


# Controller <-> host agent (monarch_nb.agent), signed with the host mesh's
# agent key. Workers' own messages pass through an agent unchanged (they are
# signed with their mesh's key); these are the agent's own.


@_message
@dataclass(frozen=True, slots=True)
class AgentHello(Message):
    """An agent is up: where it runs, a free port there (for MASTER_PORT), and how
    many GPUs it may hand out (its CUDA_VISIBLE_DEVICES, or every GPU)."""

    TAG: ClassVar[int] = 60
    host_index: int
    hostname: str
    address: str  # the address this host reaches the controller from
    pid: int
    free_port: int
    gpus: int


@_message
@dataclass(frozen=True, slots=True)
class AgentHeartbeat(Message):
    """Both ways, every heartbeat period: silence means the other side is gone.

    An agent's carries a port free on its host just then (as its hello does):
    the next mesh's ``MASTER_PORT``, if its rank 0 is there. The controller's: 0.
    """

    TAG: ClassVar[int] = 61
    free_port: int = 0


@_message
@dataclass(frozen=True, slots=True)
class LaunchWorkers(Message):
    """Start workers: ``(identity, env, bootstrap)`` each. ``env`` adds to the agent's
    environment; ``bootstrap`` (with the mesh key) goes to the worker's stdin."""

    TAG: ClassVar[int] = 62
    workers: tuple[tuple[str, dict[str, str], dict[str, Any]], ...]


@_message
@dataclass(frozen=True, slots=True)
class KillWorkers(Message):
    """SIGKILL these workers (identities); their exits are reported as usual."""

    TAG: ClassVar[int] = 63
    identities: tuple[str, ...]


@_message
@dataclass(frozen=True, slots=True)
class AgentShutdown(Message):
    """Kill every worker and exit (a launched agent) or wait for the next controller."""

    TAG: ClassVar[int] = 64


@_message
@dataclass(frozen=True, slots=True)
class WorkerStarted(Message):
    TAG: ClassVar[int] = 65
    identity: str
    pid: int


@_message
@dataclass(frozen=True, slots=True)
class WorkerOutput(Message):
    """Raw bytes a worker wrote to ``stream`` (lines are split on the controller)."""

    TAG: ClassVar[int] = 66
    identity: str
    stream: str
    data: bytes


@_message
@dataclass(frozen=True, slots=True)
class WorkerExited(Message):
    """``returncode`` as Popen reports it (negative: killed by that signal)."""

    TAG: ClassVar[int] = 67
    identity: str
    returncode: int


@_message
@dataclass(frozen=True, slots=True)
class PySpyRequest(Message):
    """Run py-spy on one of the agent's workers (``mode``: "dump" or "record"); the
    agent answers with a PySpyReply of the same ``request_id``."""

    TAG: ClassVar[int] = 71
    request_id: int
    identity: str
    mode: str
    native: bool
    seconds: int
    fmt: str
    rate: int
    timeout: float
    full_filenames: bool


@_message
@dataclass(frozen=True, slots=True)
class PySpyReply(Message):
    """What py-spy gave on the agent's host (see ``_py_spy.Outcome``)."""

    TAG: ClassVar[int] = 72
    request_id: int
    returncode: int
    stdout: str
    stderr: str
    data: bytes


@_message
@dataclass(frozen=True, slots=True)
class SyncWorkspace(Message):
    """Unpack ``archive`` (a tar, maybe gzipped) into ``dest`` on the agent's host (``~``
    expanded, made if missing); with ``on_path``, workers the agent starts later
    get ``dest`` on their ``PYTHONPATH``. Answered by :class:`WorkspaceSynced`."""

    TAG: ClassVar[int] = 73
    request_id: int
    dest: str
    archive: bytes
    on_path: bool


@_message
@dataclass(frozen=True, slots=True)
class WorkspaceSynced(Message):
    """Where :class:`SyncWorkspace` put the files (``path``, expanded), how many
    files and bytes, or why it could not (``error``)."""

    TAG: ClassVar[int] = 74
    request_id: int
    path: str
    files: int
    nbytes: int
    error: str


@_message
@dataclass(frozen=True, slots=True)
class AgentAttach(Message):
    """The controller's first word to an agent it connected to (``attach``), with
    the address it reached the agent at (what other hosts should use), the
    routing identity it gave the agent (what the agent's messages are sealed by)
    and the agent's place in the host mesh (the order of ``attach``'s list: an
    agent started without an index learns it here, for this session)."""

    TAG: ClassVar[int] = 68
    address: str
    identity: str
    host_index: int


@_message
@dataclass(frozen=True, slots=True)
class AgentSuperseded(Message):
    """A listening agent's word to a controller it no longer serves: another one
    attached since (the newest wins). Sent once; the controller loses the host."""

    TAG: ClassVar[int] = 75
    hostname: str
    pid: int


@_message
@dataclass(frozen=True, slots=True)
class ReadLogs(Message):
    """Read this host's log files of ``ranks`` of mesh ``mesh`` (under ``root``, the
    workers' ``MONARCH_NB_LOG_DIR``; "" for the default), filtered as
    ``ProcMesh.logs`` does; ``since`` in seconds of the epoch."""

    TAG: ClassVar[int] = 69
    request_id: int
    mesh: str
    ranks: tuple[int, ...]
    root: str
    grep: str | None
    since: float | None
    level: int | None
    tail: int | None


@_message
@dataclass(frozen=True, slots=True)
class LogLines(Message):
    """The answer to :class:`ReadLogs`: ``(rank, ISO time, stream, text)`` each, or
    why they could not be read (``error``)."""

    TAG: ClassVar[int] = 70
    request_id: int
    lines: tuple[tuple[int, str, str, str], ...]
    error: str
