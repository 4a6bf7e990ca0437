"""Every error monarch_nb raises, in one place.

::

    MonarchNbError
     ├── MeshFailure          a process died, a broadcast failed, or the mesh was stopped:
     │    │                   the mesh is unusable until restart()
     │    ├── SupervisionError  an endpoint call reached an actor that has failed (also a
     │    │                   RuntimeError, as Monarch's): the call's own MeshFailure
     │    └── StuckRanksKilled  ranks that did not stop within the grace after an
     │                        interrupt were killed (stuck in C, in a collective)
     ├── RemoteError          user code raised on one or more ranks (the mesh stays usable)
     │    ├── SpawnError      an actor's __init__ raised
     │    └── CellError       a %%mesh cell raised
     ├── SerializationError   a value could not be pickled or unpickled (names rank and type)
     ├── EndpointError        the thing called is not an endpoint (lists the endpoints)
     ├── CallTimeout          ranks did not reply in time (names them); also a TimeoutError
     ├── CallCancelled        the caller cancelled the call's future
     ├── ReplayError          restart(replay=True): a step of the history failed again
     ├── ProfilerUnavailable  native stacks or a profile need py-spy, and it is missing or
     │                        the OS refused it (says which, and what to do)
     └── MeshUsageError       wrong use of the API (bad slice, call_one on many points, ...)

Remote errors keep the remote traceback as text with real source lines and
render natively in IPython (``_render_traceback_``), grouped by identical
traceback and labelled with the rank set.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ._failure_fold import differing, failure_key, fold_traceback
from ._fold import MAX_GROUPS_SHOWN, fold, fold_lines, format_ranks, more, value_text
from ._public import publish


class _Ranks(Protocol):
    @property
    def ranks(self) -> Sequence[int]: ...


class SucceededValues(Protocol):
    """What a RemoteError keeps of the ranks that succeeded: a ValueMesh (which
    sits above the errors, since its checks raise them)."""

    @property
    def shape(self) -> _Ranks: ...

    def __len__(self) -> int: ...

    def values(self) -> list[Any]: ...


# How IPython shows our errors (``_render_traceback_``): the plain lines, unless
# the notebook layer installed IPython's colours and the notebook's words
# (magics/_tracebacks). ``style(error, lines) -> lines``.
_ipython_style: Callable[[BaseException, list[str]], list[str]] | None = None


def set_ipython_style(style: Callable[[BaseException, list[str]], list[str]] | None) -> None:
    """Install how errors render in IPython (None: plain text)."""
    global _ipython_style
    _ipython_style = style


def ipython_lines(error: BaseException, lines: list[str]) -> list[str]:
    """``lines`` of ``error`` as IPython should show them (see set_ipython_style)."""
    style = _ipython_style
    return style(error, lines) if style is not None else lines


class MonarchNbError(Exception):
    """Root of every monarch_nb error."""


class MeshUsageError(MonarchNbError, ValueError):
    """The API was used in a way that cannot work; the message says the right way."""


class ReplayError(MonarchNbError):
    """A step of a mesh's history failed when ``restart(replay=True)`` sent it again;
    ``.step`` is its number in ``procs.history()`` (None: nothing was replayed).
    The processes run, with the state the steps before it built."""

    def __init__(self, message: str, *, step: int | None) -> None:
        super().__init__(message)
        self.step = step


class EndpointError(MonarchNbError, AttributeError):
    """The name called on an actor mesh is not one of its endpoints."""

    def __init__(self, message: str, *, actor: str, endpoint: str, endpoints: Sequence[str]):
        super().__init__(message)
        self.actor, self.endpoint, self.endpoints = actor, endpoint, tuple(endpoints)


class SerializationError(MonarchNbError, TypeError):
    """A value could not cross the wire; ``.ranks`` says where, ``.type_name`` what."""

    def __init__(self, message: str, *, ranks: Sequence[int] = (), type_name: str = ""):
        super().__init__(message)
        self.ranks, self.type_name = tuple(ranks), type_name


@dataclass(frozen=True)
class RemoteFailure:
    """One rank's failure as it came over the wire (plain data, picklable)."""

    rank: int
    type_name: str
    message: str
    traceback: str  # the remote traceback as text, source lines included
    # The failure ended its actor on that rank (an endpoint raised a BaseException
    # that is not an Exception): Monarch's supervision event. The call raises
    # SupervisionError, not RemoteError, and so do later calls to that actor.
    actor_failed: bool = False


def never_constructed(failure: RemoteFailure) -> RemoteFailure:
    """How a rank answers a call to an actor whose ``__init__`` raised ``failure``
    there: that failure (its traceback is where ``__init__`` raised), said so."""
    return RemoteFailure(
        failure.rank,
        failure.type_name,
        f"{failure.message} (raised by its __init__, so the actor does not exist)",
        failure.traceback,
    )


class RemoteError(MonarchNbError):
    """User code raised on one or more ranks.

    ``.failures`` holds one :class:`RemoteFailure` per failed rank; ``.ranks``
    the failed ranks; ``.remote_traceback`` the first traceback; ``.values``
    the :class:`~monarch_nb.ValueMesh` of the ranks that succeeded (None if
    none did). The message groups identical tracebacks and labels each group
    with its rank set; ranks that were only interrupted (``KeyboardInterrupt``
    while another rank failed, as ``--fail-fast`` does) are named on one line.
    """

    what = "call"

    def __init__(
        self,
        failures: Sequence[RemoteFailure],
        *,
        actor: str = "",
        endpoint: str = "",
        values: SucceededValues | None = None,
    ) -> None:
        self.failures = tuple(sorted(failures, key=lambda f: f.rank))
        self.actor, self.endpoint = actor, endpoint
        self.ranks = tuple(f.rank for f in self.failures)
        self.remote_traceback = self.failures[0].traceback if self.failures else ""
        self.values = values
        super().__init__(self._summary())

    @property
    def target(self) -> str:
        return f"{self.actor}.{self.endpoint}" if self.endpoint else self.actor

    @property
    def interrupted(self) -> tuple[int, ...]:
        """Ranks that were only interrupted while another rank failed (not a failure
        of their own): their tracebacks are left out of :meth:`render`."""
        interrupts = tuple(f.rank for f in self.failures if _is_interrupt(f))
        return interrupts if len(interrupts) < len(self.failures) else ()

    def groups(self) -> list[tuple[tuple[int, ...], RemoteFailure]]:
        """Failures grouped by exception type and code location (the traceback's
        frames): ``[(ranks, failure), ...]``, without the ranks that were only
        :attr:`interrupted`. Where the ranks' messages differ, the group's failure
        is the first rank's, its traceback ending in every message folded by rank."""
        interrupted = set(self.interrupted)
        failures = [f for f in self.failures if f.rank not in interrupted]
        groups = fold(
            ((f.rank, f) for f in failures), key=lambda f: failure_key(f.type_name, f.traceback)
        )
        out = []
        for ranks, first in groups:
            chosen = set(ranks)
            messages = [(f.rank, f.message) for f in failures if f.rank in chosen]
            traceback = fold_traceback(first.traceback, first.type_name, messages)
            out.append((ranks, dataclasses.replace(first, traceback=traceback)))
        return out

    def _summary(self) -> str:
        failed = [f for f in self.failures if f.rank not in set(self.interrupted)]

        def messages(ranks: tuple[int, ...], f: RemoteFailure) -> str:
            count = differing([(x.rank, x.message) for x in failed if x.rank in ranks])
            return f" (rank {ranks[0]}'s; {count} different messages)" if count > 1 else ""

        head = ", ".join(
            f"ranks {format_ranks(ranks)}: {f.type_name}: {f.message}{messages(ranks, f)}"
            if len(ranks) > 1
            else f"rank {ranks[0]}: {f.type_name}: {f.message}"
            for ranks, f in self.groups()[:MAX_GROUPS_SHOWN]
        )
        if self.interrupted:
            head += f" (rank(s) {format_ranks(self.interrupted)} interrupted)"
        return f"{self.target} failed on {head}"

    def __str__(self) -> str:
        # One line, unless the remote exception was raised from (or while handling)
        # another: then the chain, which the line alone hides, as Python prints it.
        summary = super().__str__()
        chained = self.remote_traceback
        if _CAUSE in chained or _CONTEXT in chained:
            return f"{summary}\n{chained.rstrip()}"
        return summary

    def render(self) -> str:
        """Full text: each distinct remote traceback once, labelled by rank set, then
        the interrupted ranks and the values of the ranks that succeeded."""
        groups = self.groups()
        failed = [r for ranks, _ in groups for r in ranks]
        lines = [f"{self.what} {self.target} failed on rank(s) {format_ranks(failed)}"]
        for ranks, failure in groups[:MAX_GROUPS_SHOWN]:
            lines.append(
                f"--- Traceback of where the remote call failed (rank {format_ranks(ranks)}):"
            )
            lines.append(failure.traceback.rstrip())
        tail = more(len(groups), what="more distinct tracebacks")
        if tail:
            lines.append(tail)
        if self.interrupted:
            lines.append(
                f"--- rank(s) {format_ranks(self.interrupted)} were interrupted "
                "(KeyboardInterrupt) and did not finish"
            )
        lines += self.render_values()
        return "\n".join(lines)

    def render_values(self) -> list[str]:
        """The values of the ranks that succeeded, folded, under a heading (or nothing)."""
        values = self.values
        if values is None or not len(values):
            return []
        ranks = values.shape.ranks
        texts = (value_text(v) for v in values.values())
        return [
            f"--- rank(s) {format_ranks(ranks)} succeeded; their values are in .values:",
            *fold_lines(zip(ranks, texts, strict=True)),
        ]

    def _render_traceback_(self) -> list[str]:
        # IPython calls this instead of formatting the local traceback.
        return ipython_lines(self, self.render().splitlines())

    def __reduce__(self):
        return (_rebuild_remote_error, (type(self), self.failures, self.actor, self.endpoint))


def _rebuild_remote_error(cls, failures, actor, endpoint):
    # .values stay behind: they may not pickle, and the failures are what travels.
    return cls(failures, actor=actor, endpoint=endpoint)


# What Python's traceback prints between the links of an exception's chain.
_CAUSE = "The above exception was the direct cause of the following exception:"
_CONTEXT = "During handling of the above exception, another exception occurred:"


def _is_interrupt(failure: RemoteFailure) -> bool:
    return failure.type_name == "KeyboardInterrupt"


class SpawnError(RemoteError):
    """An actor's ``__init__`` raised; the process mesh is still usable."""

    what = "spawn of"


class CellError(RemoteError):
    """A ``%%mesh`` cell (or ``run_cell``) raised on one or more ranks."""

    what = "%%mesh"


class MeshFailure(MonarchNbError):
    """A mesh can no longer be used: a process died, a broadcast failed, or it was stopped.

    ``.ranks`` are the ranks that failed; ``.cause`` says why (an exit code, a
    signal, a :class:`RemoteError`); ``.mesh`` names the process mesh and
    ``.actor`` the actor mesh (None when processes failed), as Monarch's
    supervision events say which actor, which rank and why. Calls on the mesh
    raise this at once until ``procs.restart()``.
    """

    def __init__(
        self,
        message: str,
        *,
        ranks: Sequence[int] = (),
        cause: object = None,
        mesh: str | None = None,
        actor: str | None = None,
        actor_class: str | None = None,
        point: object = None,
    ):
        super().__init__(message)
        self.ranks, self.cause = tuple(ranks), cause
        self.mesh, self.actor = mesh, actor
        # Where an actor failed: its class (module.Class) and its point in its mesh.
        self.actor_class, self.point = actor_class, point

    def __str__(self) -> str:
        # An actor mesh's failure also reads as Monarch's (its name and the
        # crashed ranks), which programs written for Monarch look for.
        message = super().__str__()
        actor, ranks = getattr(self, "actor", None), getattr(self, "ranks", ())
        if actor is None or not ranks:
            return message
        return f"{message} (MeshFailure(mesh_name={actor}, crashed_ranks={list(ranks)}))"

    def headline(self) -> str:
        """One line naming the actor that failed, its point, and why, as Monarch's
        supervision events do: ``The actor mod.Cls name{'gpus': 1/2} and all its
        descendants have failed: ...`` (just the message where no actor is known)."""
        if self.actor_class is None or self.actor is None:
            return str(self)
        point = "" if self.point is None else str(self.point)
        return (
            f"The actor {self.actor_class} {self.actor}{point} and all its descendants "
            f"have failed: {self}"
        )

    def _render_traceback_(self) -> list[str]:
        lines = [f"{type(self).__name__}: {self}"]
        if isinstance(self.cause, RemoteError) and self.cause.failures:
            lines += self.cause.render().splitlines()
        return ipython_lines(self, lines)

    def report(self) -> str:
        """The whole story as text: which actor failed where (:meth:`headline`), the
        failure, and the remote traceback of its cause."""
        story = "\n".join(self._render_traceback_())
        return story if self.actor_class is None else f"{self.headline()}\n{story}"


class MeshStopped(MeshFailure, RuntimeError):
    """A call or spawn on a process mesh after its ``stop()``: a ``MeshFailure``
    and, as Monarch's "`ProcMesh` has already been stopped", a ``RuntimeError``."""


class SupervisionError(MeshFailure, RuntimeError):
    """An endpoint call reached an actor that has failed: Monarch's ``SupervisionError``.

    The actor is gone on ``.ranks``: an endpoint of it raised a ``BaseException``
    that is not an ``Exception`` (``SystemExit``, a class of one's own), its
    process died, or its actor mesh failed (a failed ``broadcast()``). The call
    that met the failure raises this, and so does every later call to that
    actor, until it is spawned again. ``.endpoint`` names the call
    (``Cls.endpoint``); the message begins ``Endpoint call Cls.endpoint()
    failed,`` and says which actor failed, where and why, as Monarch's. What
    the actor's owner gets in ``__supervise__`` (or ``unhandled_fault_hook``)
    is the :class:`MeshFailure` itself; this is the call's error. It is a
    ``MeshFailure`` (``except MeshFailure`` still catches it) and, as
    Monarch's, a ``RuntimeError``. An ``Exception`` an endpoint raises is not
    this but :class:`RemoteError` (Monarch's ``ActorError``): the actor lives on.
    """

    def __init__(self, message: str, *, endpoint: str | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.endpoint = endpoint

    def __str__(self) -> str:
        # The message already names the actor (MeshFailure's own tail is in it).
        text = Exception.__str__(self)
        endpoint = getattr(self, "endpoint", None)
        return f"Endpoint call {endpoint}() failed, {text}" if endpoint else text

    def headline(self) -> str:
        return str(self)

    @classmethod
    def of(
        cls,
        failure: MeshFailure,
        endpoint: str,
        *,
        actor: str | None = None,
        actor_class: str | None = None,
        point: object = None,
    ) -> SupervisionError:
        """``failure`` (of the actor mesh or the processes a call of ``endpoint``
        went to) as that call's error. ``actor``, ``actor_class`` and ``point``
        name the actor the call went to where ``failure`` does not (its
        processes failed: the actor is gone with them)."""
        actor = actor or failure.actor
        actor_class = actor_class or failure.actor_class
        point = failure.point if point is None else point
        if actor_class is not None:
            where = f"{actor_class} {actor}{'' if point is None else point}"
        else:
            where = endpoint.partition(".")[0]
            where += f" on rank(s) {format_ranks(failure.ranks)}" if failure.ranks else ""
        error = cls(
            f"The actor {where} and all its descendants have failed: {failure}",
            endpoint=endpoint,
            ranks=failure.ranks,
            cause=failure.cause,
            mesh=failure.mesh,
            actor=actor,
            actor_class=actor_class,
            point=point,
        )
        error.__cause__ = failure
        return error

    @classmethod
    def of_failures(
        cls, failures: Sequence[RemoteFailure], *, actor: str, endpoint: str
    ) -> SupervisionError:
        """The error of a call whose ranks answered ``failures``, some of which
        ended their actor (``actor_failed``): the first of those says why, the
        rest are in ``.cause`` (a RemoteError with every failure)."""
        fatal = sorted((f for f in failures if f.actor_failed), key=lambda f: f.rank)
        ranks = tuple(f.rank for f in fatal)
        message = fatal[0].message
        if len(ranks) > 1:
            message += f" (the same call ended it on rank(s) {format_ranks(ranks[1:])} too)"
        return cls(
            message,
            endpoint=f"{actor}.{endpoint}" if endpoint else actor,
            ranks=ranks,
            cause=RemoteError(failures, actor=actor, endpoint=endpoint),
        )


class _EndingCall(Protocol):
    """A call in flight, as :func:`for_call` reads it (a PendingCall)."""

    @property
    def label(self) -> str: ...

    error_class: type[RemoteError]


def for_call(call: _EndingCall, error: BaseException) -> BaseException:
    """``error``, which ends ``call`` before its ranks answered, as the call raises
    it: for an endpoint call, a plain MeshFailure is a SupervisionError."""
    if call.error_class is EndpointFailed:
        return supervision_error_of(error, call.label)
    return error


def supervision_error_of(error: BaseException, endpoint: str) -> BaseException:
    """``error`` as a call of ``endpoint`` raises it: a plain :class:`MeshFailure`
    (the actor mesh, or the processes it runs on, failed) becomes a
    :class:`SupervisionError`, as Monarch's calls raise; anything else (a
    :class:`StuckRanksKilled`, a RemoteError) stays as it is."""
    if isinstance(error, MeshFailure) and type(error) in (MeshFailure, MeshStopped):
        return SupervisionError.of(error, endpoint)
    return error


class EndpointFailed(RemoteError):
    """The ``error_class`` of endpoint calls: what their ranks' failures become.

    A :class:`RemoteError` (Monarch's ``ActorError``: the endpoint raised, the
    actor lives on), or a :class:`SupervisionError` where a failure ended its
    actor (``RemoteFailure.actor_failed``). Constructing it returns one of those
    two, never an instance of this class, so ``type(error)`` reads as ever.
    """

    def __new__(  # type: ignore[misc]
        cls,
        failures: Sequence[RemoteFailure],
        *,
        actor: str = "",
        endpoint: str = "",
        values: SucceededValues | None = None,
    ) -> MonarchNbError:
        if any(f.actor_failed for f in failures):
            return SupervisionError.of_failures(failures, actor=actor, endpoint=endpoint)
        return RemoteError(failures, actor=actor, endpoint=endpoint, values=values)


class StuckRanksKilled(MeshFailure):
    """Ranks still running a call ``grace`` s after its interrupt (stuck outside Python:
    in C, in a collective) were killed by monarch_nb; ``.ranks`` names them, ``.stuck``
    says which call and why in one sentence, ``.where`` where the ranks were before the
    kill (the hang diagnosis, or ""). The notebook replaces them with fresh processes."""

    def __init__(self, message: str, *, stuck: str = "", where: str = "", **kw: Any) -> None:
        super().__init__(message, **kw)
        self.stuck, self.where = stuck or message, where


class CallTimeout(MonarchNbError, TimeoutError):
    """Some ranks did not reply within the timeout; ``.ranks`` names them, and
    ``.silent`` those of them the controller got no heartbeat from lately (a
    stopped process: the others may just be waiting for it)."""

    def __init__(self, message: str, *, ranks: Sequence[int] = (), silent: Sequence[int] = ()):
        super().__init__(message)
        self.ranks = tuple(ranks)
        self.silent = tuple(silent)


class CallCancelled(MonarchNbError):
    """The call's future was cancelled; ``.ranks`` had not replied by then."""

    def __init__(self, message: str, *, ranks: Sequence[int] = ()):
        super().__init__(message)
        self.ranks = tuple(ranks)


class ProfilerUnavailable(MonarchNbError, RuntimeError):
    """py-spy (native stacks, profiles) cannot run: it is not installed (here, or on
    a rank's host), or the OS refused to let it attach (ptrace). ``.ranks`` are
    the ranks it could not reach; the message says what to do."""

    def __init__(self, message: str, *, ranks: Sequence[int] = ()):
        super().__init__(message)
        self.ranks = tuple(ranks)


publish(globals())
