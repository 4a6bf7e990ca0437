"""Restarting a process group: every process, or only some ranks' (by hand or by policy).

A partial restart replaces the chosen ranks' processes while the others keep
their namespaces and actors; the actors that lived there are spawned again
with their first arguments, then the ``after_restart`` hooks run. A
:class:`~._recovery.RestartPolicy` does it by itself, on a thread of its own.
"""

from __future__ import annotations

import functools
import secrets
import threading
import time
from collections import deque
from collections.abc import Iterable

from .._model._errors import MeshFailure, MeshUsageError, SpawnError
from .._model._shape import Shape
from .._wire._messages import Spawn
from . import _events as ev
from ._calls import CallFuture, send_call
from ._group_core import GroupCore
from ._lifecycle import Failed, SpawnRecord, Starting, Stopped, describe_ranks
from ._recovery import RestartBudget, RestartPolicy
from ._status import RestartRecord
from ._workers import KILL_WAIT_S, LocalWorker


class Restarter:
    """Brings a group's processes back (see the module docstring)."""

    def __init__(self, group: GroupCore, policy: RestartPolicy | None) -> None:
        self._group = group
        self.budget = RestartBudget(policy) if policy is not None else None
        self.records: deque[RestartRecord] = deque(maxlen=20)
        self._incarnation: dict[int, int] = {}
        self.replacing_all = False  # restart(): between the kill and the new start
        self.restart_failed: dict[int, str] = {}  # rank -> why its new process did not start
        self.ready_changed = threading.Condition()
        self.restart_lock = threading.Lock()
        self._pending: dict[int, str] = {}  # rank -> cause, for the policy's thread
        self._thread: threading.Thread | None = None

    def restart(self, ranks: Iterable[int] | None = None) -> RestartRecord:
        """Replace every process with a fresh one (actors must be spawned again), or
        only those of ``ranks`` (see :meth:`restart_ranks`). Blocking."""
        if ranks is not None:
            chosen = sorted(set(ranks))
            return self.restart_ranks(tuple(chosen), cause=f"restart(ranks={chosen})")
        return self.restart_all("restart()", automatic=False)

    def restart_all(self, cause: str, *, automatic: bool) -> RestartRecord:
        started = time.monotonic()
        spawned = tuple(dict.fromkeys(r.name for r in self._group.spawned.values()))
        self.replacing_all = True  # the kill's "stopped" reads as "starting" meanwhile
        try:
            self._group.kill()
            self._group.start()
        finally:
            self.replacing_all = False
        for hook in list(self._group.after_restart):
            hook(self._group.shape.ranks)
        return self._restarted(self._group.shape.ranks, cause, automatic, (), spawned, started)

    def restart_ranks(
        self, ranks: tuple[int, ...], *, cause: str, automatic: bool = False
    ) -> RestartRecord:
        """Replace the processes of ``ranks`` only (dead or alive); the other ranks keep
        their namespaces and actors. The actors that lived on ``ranks`` are spawned
        again with the arguments they were first given; then the ``after_restart``
        hooks run (``--dist``: the process group is set up again on every rank).
        Blocking; raises MeshFailure if a new process does not start (those ranks
        stay dead), MeshUsageError if the mesh cannot be restarted in part."""
        unknown = [r for r in ranks if r not in self._group.shape.ranks]
        if not ranks or unknown:
            raise MeshUsageError(
                f"restart(ranks={list(ranks)!r}): process mesh {self._group.name!r} has ranks "
                f"{describe_ranks(self._group.shape.ranks)}"
            )
        match self._group.state:
            case Stopped():
                raise MeshUsageError(
                    f"process mesh {self._group.name!r} was stopped; start a new one "
                    "(restart(ranks=...) brings back ranks of a running mesh)"
                )
            case Failed(error):
                raise MeshUsageError(
                    f"process mesh {self._group.name!r} failed as a whole ({error}); restart() "
                    "replaces every process"
                )
            case Starting():
                raise MeshUsageError(f"process mesh {self._group.name!r} is starting; wait for it")
        if self._group.agents is not None:
            raise MeshUsageError(
                f"process mesh {self._group.name!r} runs on several hosts: restart(ranks=...) "
                "is not supported there yet; restart() replaces every process"
            )
        with self.restart_lock:
            started = time.monotonic()
            self._replace(ranks, cause)
            respawned, to_spawn_again = self._respawn(ranks)
            for hook in list(self._group.after_restart):
                hook(ranks)
            return self._restarted(ranks, cause, automatic, respawned, to_spawn_again, started)

    def _replace(self, ranks: tuple[int, ...], cause: str) -> None:
        """Kill the processes of ``ranks`` and start new ones; wait for their hello."""
        error = MeshFailure(
            f"rank(s) {describe_ranks(ranks)} of process mesh {self._group.name!r} are being "
            f"restarted ({cause})",
            ranks=ranks,
        )

        def mark() -> None:
            self._group.restarting.update(ranks)
            for rank in ranks:
                self.restart_failed.pop(rank, None)
            for actor_id, record in self._group.spawned.items():
                on = [r for r in ranks if r in record.ranks and r not in record.stopped]
                missing = self._group.missing_actors.setdefault(actor_id, {})
                for rank in on:
                    missing[rank] = f"it is being spawned again on rank {rank}, which restarted"

        self._group.end_ranks(ranks, error, mark)
        old = [self._group.workers[r] for r in ranks]
        for w in old:
            w.kill()
        for w in old:
            w.wait(KILL_WAIT_S)
        self._group.forget(old)

        def launch() -> list[LocalWorker]:
            if isinstance(self._group.state, Stopped | Failed):
                return []
            new = []
            for rank in ranks:
                self._incarnation[rank] = self._incarnation.get(rank, 0) + 1
                # Random, as at the start: a guessed name could be claimed first.
                identity = f"w{secrets.token_hex(16)}.{rank}.{self._incarnation[rank]}"
                self._group.ready_ranks.discard(rank)
                self._group.paused.discard(rank)
                self._group.rank_failures.pop(rank, None)
                self._group.controller.add_peer(identity.encode(), self._group, rank, None)
                worker = self._group.launch(
                    rank, identity.encode(), self._group._key, self._group._env
                )
                self._group.workers[rank] = worker
                self._group.watch_one(worker)
                new.append(worker)
            return new

        new = self._group.controller.run(launch)
        if self._group.events.observed:
            for rank in ranks:
                self._group.events.emit(
                    ev.RankStateChanged(self._group.name, rank, ev.RankState.STARTING)
                )

        def settled() -> bool:
            if isinstance(self._group.state, Stopped | Failed):
                return True
            return all(r in self._group.ready_ranks or r in self.restart_failed for r in ranks)

        with self.ready_changed:
            self.ready_changed.wait_for(settled, self._group.start_timeout_s)
        if isinstance(self._group.state, Stopped | Failed):
            for w in new:
                w.kill()
            self._group.restarting.difference_update(ranks)
            raise self._group.failure_for(ranks) or MeshFailure(
                f"process mesh {self._group.name!r} stopped during a restart", ranks=ranks
            )
        failed = {r: self.restart_failed.get(r) for r in ranks if r not in self._group.ready_ranks}
        if failed:
            for w in new:
                if w.rank in failed:
                    w.kill()
            why = "; ".join(
                f"rank {r}: {text or f'no hello within {self._group.start_timeout_s} s'}"
                for r, text in failed.items()
            )
            lost = MeshFailure(
                f"could not restart rank(s) {describe_ranks(tuple(failed))} of process mesh "
                f"{self._group.name!r} ({why}); they stay dead: call restart(ranks=...) again or "
                "restart()",
                ranks=tuple(failed),
            )

            def still_dead() -> None:
                for rank in failed:
                    self._group.dead[rank] = lost
                self._group.restarting.difference_update(ranks)

            self._group.end_ranks(tuple(failed), lost, still_dead)
            raise lost
        for rank in ranks:
            self._group.dead.pop(rank, None)
        self._group.restarting.difference_update(ranks)

    def spawn_again(self, actor_id: int, record: SpawnRecord, on: tuple[int, ...]) -> CallFuture:
        """Send the spawn of ``record`` again to ranks ``on``, with its old actor id (so
        references to it reach the new instances); a future of its completion."""
        message = functools.partial(
            Spawn,
            actor_id=actor_id,
            name=record.name,
            labels=record.labels,
            sizes=record.sizes,
            ranks=record.ranks,
        )
        return send_call(
            self._group,
            Shape(("ranks",), (len(on),), on),
            lambda call_id: message(call_id),
            (record.cls, record.args, record.kwargs),
            actor=f"{record.cls.__name__} {record.name!r}",
            error_class=SpawnError,
        ).future

    def _respawn(self, ranks: tuple[int, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Spawn again, on ``ranks``, the actors that lived there: (spawned again, failed)."""
        calls = []
        for actor_id, record in list(self._group.spawned.items()):
            on = tuple(r for r in ranks if r in record.ranks and r not in record.stopped)
            if not on:
                continue
            calls.append((actor_id, record, on, self.spawn_again(actor_id, record, on)))
        respawned: list[str] = []
        failed: list[str] = []
        for actor_id, record, on, future in calls:
            missing = self._group.missing_actors.setdefault(actor_id, {})
            try:
                future.get(timeout=self._group.start_timeout_s)
            except Exception as exc:
                for rank in on:
                    missing[rank] = (
                        f"spawning it again on rank {rank}, which restarted, failed "
                        f"({type(exc).__name__}: {exc}); spawn it again yourself"
                    )
                failed.append(record.name)
                continue
            for rank in on:
                missing.pop(rank, None)
            if not missing:
                del self._group.missing_actors[actor_id]
            respawned.append(record.name)
        return tuple(dict.fromkeys(respawned)), tuple(dict.fromkeys(failed))

    def _restarted(
        self,
        ranks: tuple[int, ...],
        cause: str,
        automatic: bool,
        respawned: tuple[str, ...],
        to_spawn_again: tuple[str, ...],
        started: float,
    ) -> RestartRecord:
        record = RestartRecord(
            time.time(),
            ranks,
            cause,
            automatic,
            respawned,
            to_spawn_again,
            time.monotonic() - started,
        )
        self.records.append(record)
        self._group.timeline.restarted(ranks)  # marks of the old processes go
        if self._group.events.observed:
            self._group.events.emit(
                ev.RanksRestarted(
                    self._group.name, ranks, cause, automatic, respawned, to_spawn_again
                )
            )
        return record

    def notify(self) -> None:
        with self.ready_changed:
            self.ready_changed.notify_all()

    def schedule(self, ranks: tuple[int, ...], cause: str) -> None:
        """Have the policy's thread restart ``ranks`` (I/O thread: never blocks here)."""
        with self.ready_changed:
            for rank in ranks:
                self._pending[rank] = cause
            if self._thread is not None:
                return  # it takes these too, once done with the ones before
            self._thread = threading.Thread(
                target=self._restart_loop,
                name=f"monarch_nb-restart-{self._group.name}",
                daemon=True,
            )
        self._thread.start()

    def _restart_loop(self) -> None:
        policy = self._group.restart_policy
        assert policy is not None
        while True:
            with self.ready_changed:
                pending, self._pending = self._pending, {}
                if not pending or isinstance(self._group.state, Stopped | Failed):
                    self._thread = None
                    return
            cause = "; ".join(dict.fromkeys(pending.values()))
            try:
                if policy.ranks == "all":
                    self.restart_all(cause, automatic=True)
                else:
                    self.restart_ranks(tuple(sorted(pending)), cause=cause, automatic=True)
            except Exception as exc:
                if isinstance(self._group.state, Stopped | Failed):
                    continue
                self._group.fail(
                    MeshFailure(
                        f"process mesh {self._group.name!r}: the automatic restart after ({cause}) "
                        f"failed: {exc}; the mesh is failed: call restart()",
                        ranks=tuple(sorted(pending)),
                        cause=exc,
                    )
                )
