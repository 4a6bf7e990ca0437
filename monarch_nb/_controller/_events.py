"""One typed event stream per process mesh: what happened, as plain frozen data.

Everything that watches a mesh — the default printer of a script, the
``%%mesh`` renderer, the dashboard, the side panel, tests — subscribes to
the same stream::

    with procs.events.subscribe(print, kinds=(RankFailed,)):
        ...

Observers run on the controller's I/O thread, one event at a time, in the
order events happened: an event raised on another thread (a call sent, a
future cancelled) is queued and handed to the I/O thread. Keep observers
short (hand slow work to another thread). An observer that raises is logged
and stays subscribed. When nobody subscribes, nothing is built: the stream
costs one truth test per event.

Events::

    RankStateChanged  a rank became starting/idle/busy/paused/failed/dead/stopped
    CallStarted       a call or cell was sent to some ranks
    CallFinished      ... and every rank answered (``error`` is None if all went well)
    Output            a line (or a progress-bar update) a rank wrote
    DisplayData       a rank's ``display(obj)``
    CommMessage       a Jupyter comm a rank opened (ipywidgets), a message on it, its close
    RankFailed        a rank raised, or its process died (cause, traceback or exit)
    MeshFailed        the mesh can no longer be used (until restart)
    RanksRestarted    some ranks (or all) got fresh processes, by restart() or a RestartPolicy
    Heartbeat         a rank's periodic sign of life, with its resource sample
    DebuggerPaused    a rank stopped in pdb and waits for a line (monarch_nb.debug)
    DebuggerOutput    text pdb wrote on a rank
    DebuggerResumed   a rank left pdb (continued, quit, interrupted, refused)
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .._model._errors import MeshFailure
from .._model._public import publish
from .._wire._messages import ResourceSample

_log = logging.getLogger("monarch_nb")

E = TypeVar("E", bound="Event")


class RankState(str, enum.Enum):
    """What one rank is doing (compares equal to its string value)."""

    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"
    PAUSED = "paused"  # stopped in the debugger
    FAILED = "failed"  # its last call raised; the process is alive and usable
    DEAD = "dead"  # the process exited
    STOPPED = "stopped"  # the mesh was stopped

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Event:
    mesh: str
    at: float = field(default_factory=time.time, kw_only=True)  # wall clock, seconds


@dataclass(frozen=True, slots=True)
class RankStateChanged(Event):
    rank: int
    state: RankState
    detail: str = ""


@dataclass(frozen=True, slots=True)
class CallStarted(Event):
    call_id: int
    label: str  # "Trainer.step", "<mesh-cell-3>", "spawn of Trainer 'trainer'"
    ranks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CallFinished(Event):
    call_id: int
    label: str
    ranks: tuple[int, ...]
    error: str | None  # one line, None if every rank succeeded


@dataclass(frozen=True, slots=True)
class Output(Event):
    rank: int
    stream: str  # "stdout" or "stderr"
    line: str
    end: str = "\n"  # "\r" for a progress-bar update that the next one overwrites


@dataclass(frozen=True, slots=True)
class DisplayData(Event):
    rank: int
    data: dict[str, Any]
    metadata: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CommMessage(Event):
    rank: int
    msg_type: str  # "comm_open", "comm_msg" or "comm_close"
    comm_id: str
    target_name: str  # for "comm_open"
    data: dict[str, Any]
    metadata: dict[str, Any]
    buffers: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class RankFailed(Event):
    rank: int
    cause: str  # "ValueError: boom" or "was killed by signal SIGKILL"
    traceback: str = ""  # the remote traceback, when the rank raised
    returncode: int | None = None  # when the process died: its exit code, or -signal
    label: str = ""  # the call or cell it was running


@dataclass(frozen=True, slots=True)
class MeshFailed(Event):
    error: MeshFailure


@dataclass(frozen=True, slots=True)
class RanksRestarted(Event):
    ranks: tuple[int, ...]  # the ranks whose processes were replaced
    cause: str  # the death that triggered it, or "restart(ranks=[1])"
    automatic: bool  # made by the mesh's RestartPolicy
    respawned: tuple[str, ...] = ()  # actor meshes spawned again on those ranks
    to_spawn_again: tuple[str, ...] = ()  # actor meshes the caller must spawn again


@dataclass(frozen=True, slots=True)
class Heartbeat(Event):
    rank: int
    sample: ResourceSample
    work: str  # what the rank's main thread runs ("" when idle)
    work_seconds: float


@dataclass(frozen=True, slots=True)
class DebuggerPaused(Event):
    rank: int
    prompt: str  # "(Pdb rank 1) "
    location: str  # "<mesh-cell-3>:2 in <module>"


@dataclass(frozen=True, slots=True)
class DebuggerOutput(Event):
    rank: int
    text: str


@dataclass(frozen=True, slots=True)
class DebuggerResumed(Event):
    rank: int
    how: str  # "continued", "quit", "interrupted", "refused: ..."


Observer = Callable[[Any], None]


class Subscription:
    """An observer's place on a stream; ``close()`` (or ``with``) removes it."""

    def __init__(self, stream: EventStream) -> None:
        self._stream = stream

    def close(self) -> None:
        """Remove this subscription (the same observer subscribed twice stays once)."""
        self._stream._remove(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


_CALL_EVENTS = (CallStarted, CallFinished, RankStateChanged)


class EventStream:
    """The events of one process mesh; subscribe any number of observers."""

    def __init__(self, mesh: str, loop: Any = None) -> None:
        self.mesh = mesh
        self._loop = loop  # the I/O loop that emits: see after_received
        self._lock = threading.Lock()
        self._observers: tuple[Observer, ...] = ()  # replaced, never mutated: emit reads it bare
        # Whether anyone subscribed (kept by _update): an attribute, since the
        # controller asks on every call and reply; ``bool(stream)`` says the same.
        self.observed = False
        # Whether anyone takes the events of calls (started, finished, a rank busy
        # or idle): asked on every call and reply, where most observers (the
        # output echo) take only Output.
        self.calls_observed = False
        self._entries: list[tuple[Subscription, Observer, tuple[type[Event], ...] | None]] = []
        self._wanted: frozenset[type[Event]] | None = frozenset()  # None: every kind
        self._queue: deque[Event] = deque()  # emitted, not yet handed to the observers
        self._drain_scheduled = False  # a drain is queued on the I/O thread (call_soon)
        self._batched_drain_scheduled = False  # ... or in its next batch (call_soon_batched)

    def __bool__(self) -> bool:
        return self.observed

    def wants(self, kind: type[Event]) -> bool:
        """Whether any observer takes events of ``kind``: emitters skip building
        the events nobody takes (e.g. per-rank state changes on every call)."""
        wanted = self._wanted
        return wanted is None or kind in wanted

    def __len__(self) -> int:
        """How many observers are subscribed."""
        return len(self._observers)

    def subscribe(
        self, observer: Observer, *, kinds: Iterable[type[Event]] | None = None
    ) -> Subscription:
        """Call ``observer(event)`` on the I/O thread for every event (of ``kinds``)."""
        wanted = tuple(kinds) if kinds is not None else None
        if wanted is not None:
            inner = observer

            def observer(event: Any) -> None:
                if isinstance(event, wanted):
                    inner(event)

        subscription = Subscription(self)
        with self._lock:
            self._entries.append((subscription, observer, wanted))
            self._update()
        return subscription

    def _remove(self, subscription: Subscription) -> None:
        with self._lock:
            self._entries = [e for e in self._entries if e[0] is not subscription]
            self._update()

    def _update(self) -> None:  # lock held
        self._observers = tuple(o for _, o, _ in self._entries)
        self.observed = bool(self._observers)
        if any(k is None for _, _, k in self._entries):
            self._wanted = None
        else:
            self._wanted = frozenset(
                sub
                for _, _, k in self._entries
                for kind in k or ()
                for sub in _with_subclasses(kind)
            )
        self.calls_observed = self.observed and any(map(self.wants, _CALL_EVENTS))

    def after_received(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the I/O thread once the events already received are emitted.

        A rank writes its output before it sends its reply; ``fn`` runs after the
        I/O thread's next poll, which reads whatever its pipes hold by then, and
        after the events queued before it, so ``fn`` sees every line the rank
        printed before it replied.
        """
        if self._loop is None:
            fn()
        else:

            def after() -> None:
                self.flush()
                fn()

            self._loop.call_after_poll(after)

    def post(self, event: Event) -> None:
        """Queue ``event`` without running observers (safe under any lock); a later
        :meth:`flush` or :meth:`emit` hands it on, in order."""
        self._queue.append(event)

    def emit(self, event: Event) -> None:
        """Queue ``event`` and hand the queue to the observers (see the module docstring)."""
        self._queue.append(event)
        self.flush()

    def emit_soon(self, event: Event) -> None:
        """Queue ``event`` and hand it to the observers within a few tens of ms
        (:meth:`flush_soon`): for the events of every call."""
        self._queue.append(event)
        self.flush_soon()

    def flush(self) -> None:
        """Hand queued events to the observers: now on the I/O thread, else soon there."""
        self._hand_on(batched=False)

    def flush_soon(self) -> None:
        """:meth:`flush`, but off the I/O thread within the loop's next batch
        (``IOLoop.call_soon_batched``, at most 20 ms): the events of a run of calls
        reach the observers together, and the I/O thread wakes once for them, not
        twice per call. Order is kept: every flush drains one queue."""
        self._hand_on(batched=True)

    def _hand_on(self, *, batched: bool) -> None:
        if not self._queue:
            # Nothing queued (a call whose events no observer takes): waking the
            # I/O thread for nothing cost every call a thread switch.
            return
        loop = self._loop
        if loop is None or loop.in_loop_thread:
            self._drain()
            return
        # A drain already queued takes these events too (unless it is a batch and
        # this flush must not wait for one).
        if self._drain_scheduled or (batched and self._batched_drain_scheduled):
            return
        if batched:
            self._batched_drain_scheduled = True
            schedule, drain = loop.call_soon_batched, self._run_batched_drain
        else:
            self._drain_scheduled = True
            schedule, drain = loop.call_soon, self._run_drain
        try:
            schedule(drain)
        except RuntimeError:  # the controller shut down: nobody is left to tell
            self._queue.clear()

    def _run_drain(self) -> None:
        self._drain_scheduled = False
        self._drain()

    def _run_batched_drain(self) -> None:
        self._batched_drain_scheduled = False
        self._drain()

    def _drain(self) -> None:
        queue = self._queue
        while queue:
            try:
                event = queue.popleft()
            except IndexError:
                return
            for observer in self._observers:
                try:
                    observer(event)
                except Exception:
                    _log.exception("monarch_nb: an event observer failed on %r", event)


def _with_subclasses(kind: type) -> list[type]:
    found: list[type] = [kind]
    subclasses: list[type] = kind.__subclasses__()
    for subclass in subclasses:
        found += _with_subclasses(subclass)
    return found


class EventLog:
    """An observer that keeps the last events and lets a thread wait for one.

    For tests and scripts::

        log = EventLog()
        with procs.events.subscribe(log):
            procs.kill([1])
            failed = log.wait_for(RankFailed, timeout=5)
    """

    def __init__(self, maxlen: int = 10_000) -> None:
        self.events: deque[Event] = deque(maxlen=maxlen)
        self._changed = threading.Condition()

    def __call__(self, event: Event) -> None:
        with self._changed:
            self.events.append(event)
            self._changed.notify_all()

    def of(self, kind: type[E]) -> list[E]:
        with self._changed:
            return [e for e in self.events if isinstance(e, kind)]

    def wait_for(
        self,
        kind: type[E],
        predicate: Callable[[E], bool] = lambda _: True,
        *,
        timeout: float = 10.0,
    ) -> E:
        """The first event (kept or to come) of ``kind`` matching ``predicate``.

        Raises TimeoutError naming what it waited for.
        """
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for event in self.events:
                    if isinstance(event, kind) and predicate(event):
                        return event
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {kind.__name__} event matched within {timeout} s")
                self._changed.wait(left)


def print_output(event: Output) -> None:
    """The default observer of a script's mesh: each line, prefixed by its rank
    unless the ``prefix_with_rank`` setting is off."""
    import sys

    from .._services import _config

    stream = sys.stderr if event.stream == "stderr" else sys.stdout
    prefix = f"[{event.rank}] " if _config.get("prefix_with_rank") else ""
    stream.write(f"{prefix}{event.line}{event.end}")
    stream.flush()


publish(globals())
