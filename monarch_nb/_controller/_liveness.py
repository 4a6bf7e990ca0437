"""Whether a group's ranks live: exits, lost hosts, failures, interrupts and stops.

A rank that dies does not fail the group: it is marked dead, the calls still
waiting on it fail, and calls to the other ranks go on. A restart policy
brings it back while its budget lasts; past that, or when a rank cannot start
or reports an unhandled supervision failure, the group as a whole fails.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Iterable

from .._model._errors import MeshFailure
from .._model._hints import restart_hint, restart_ranks_hint
from .._runtime import _context
from .._wire._messages import Interrupt, Shutdown
from . import _events as ev
from ._group_core import GroupCore
from ._lifecycle import Failed, Stopped, describe_ranks, plural_ranks
from ._proc_failure import naming_an_actor
from ._workers import KILL_WAIT_S, LocalWorker, WorkerProcess

_log = logging.getLogger("monarch_nb")
# A live rank that sent no heartbeat for three beats (at least 3 s) is stopped
# (or holds the GIL): named as such when a call to it times out. Read at use, as
# config.configure(heartbeat=...) changes the beat.
SILENT_BEATS = 3


class Liveness:
    """Notices a group's ranks ending, and ends them (interrupt, kill, stop)."""

    def __init__(self, group: GroupCore) -> None:
        self._group = group

    def on_exit(self, worker: LocalWorker) -> None:
        self._group.controller.loop.remove_fd(worker.pidfd)
        os.close(worker.pidfd)
        worker.pidfd = -1
        worker.returncode = worker.popen.wait()
        worker.kill_leftovers()
        self._group.drain_output(worker)
        self.worker_exited(worker)

    def worker_exited(self, worker: WorkerProcess) -> None:
        """``worker`` is gone, its ``returncode`` set and its output read (I/O thread)."""
        assert worker.returncode is not None
        if worker.identity not in self._identities():
            return  # a process of an earlier generation
        rank = worker.rank
        ended = isinstance(self._group.state, Stopped | Failed)
        if worker.returncode == -signal.SIGKILL and worker.oom is not None and not ended:
            worker.out_of_memory = worker.oom.evidence()  # not for the kills of a stop
        if rank in self._group.restarting:
            if rank in self._group.ready_ranks:
                return  # the old process, killed to be replaced
            self._group.restart_failed[rank] = f"its new process {worker.exit_cause()}" + (
                "; last lines of its stderr:\n  " + "\n  ".join(worker.stderr_tail)
                if worker.stderr_tail
                else ""
            )
            self._group.notify_restart()
            return
        if ended or rank not in self._group.ready_ranks:
            if self._group.events.observed:
                self._emit_exit(worker)
            if ended:
                return
        running = self._group.controller.calls_waiting_on(self._group, rank)
        what = f" while running {', '.join(running)}" if running else ""
        died = (
            f"rank {rank} (pid {worker.pid}) of process mesh {self._group.name!r} "
            f"{worker.exit_cause()}{what}"
        )
        if worker.fault_report and rank in self._group.ready_ranks:  # a crash, not a failed start
            died += "; its Python stacks when it crashed (faulthandler):\n  "
            died += "\n  ".join(worker.fault_report)
        if rank not in self._group.ready_ranks:
            consequence = "so the mesh failed to start"
            if worker.stderr_tail:
                consequence += "; last lines of its stderr:\n  " + "\n  ".join(worker.stderr_tail)
            self.fail(MeshFailure(f"{died}; {consequence}", ranks=(rank,), cause=worker.returncode))
            return
        # Its RankFailed goes out once the rank is marked dead, so a listener
        # that reacts with healthy() already gets the survivors.
        self.ranks_lost(
            (rank,),
            died,
            worker.returncode,
            announce=lambda: self._emit_exit(worker),
            quiet=bool(worker.killed_because),
        )

    def host_lost(self, workers: list[WorkerProcess], host: str, why: str) -> None:
        """Every rank on ``host`` is gone at once (its agent stopped answering, or its
        launcher ended): one failure naming exactly those ranks (I/O thread)."""
        current = self._identities()
        workers = [w for w in workers if w.identity in current and w.returncode is None]
        if not workers:
            return
        for worker in workers:
            worker.returncode, worker.lost = -signal.SIGKILL, why

        def announce() -> None:
            for worker in workers:
                self._emit_exit(worker)

        if isinstance(self._group.state, Stopped | Failed):
            announce()
            return
        ranks = tuple(sorted(w.rank for w in workers))
        self.ranks_lost(
            ranks,
            f"host {host} of process mesh {self._group.name!r} {why}: its ranks "
            f"{describe_ranks(ranks)} are lost",
            why,
            announce=announce,
        )

    def end_ranks(
        self, ranks: tuple[int, ...], error: MeshFailure, mark: Callable[[], None]
    ) -> int:
        """Fail the calls waiting on ``ranks`` (see ``Controller.end_ranks``); how many."""
        failed = self._group.controller.end_ranks(self._group, ranks, error, mark)
        # The other ranks' share of those calls has nobody waiting for it any more:
        # stop it (KeyboardInterrupt in that call only), so they are free at once;
        # not where the user is debugging (a rank paused in pdb), who goes on.
        for call in failed:
            others = [
                r for r in call.unanswered_ranks() if r not in ranks and r not in self._group.paused
            ]
            if others:
                self.interrupt(others, call.call_id)
        return len(failed)

    def ranks_lost(
        self,
        ranks: tuple[int, ...],
        what: str,
        cause: object,
        announce: Callable[[], None] = lambda: None,
        *,
        quiet: bool = False,
    ) -> None:
        """``ranks`` died (``what`` says how): fail the calls waiting on them; the
        other ranks go on. A restart policy brings them back while it may; past
        that, the mesh fails (I/O thread). ``announce`` emits their deaths: called
        once they count as dead, before any MeshFailed. ``quiet``: monarch_nb
        killed them on purpose and its caller reports it: nothing is logged."""
        budget = self._group.restart_budget
        if budget is not None and not budget.take():
            if self._group.events.observed:
                announce()
            self.fail(
                MeshFailure(
                    f"{what}; {budget.describe()}, so the mesh is failed: call restart() "
                    "to start fresh processes",
                    ranks=ranks,
                    cause=cause,
                )
            )
            return
        if budget is not None:
            policy = budget.policy
            which = "every rank" if policy.ranks == "all" else plural_ranks(ranks)
            consequence = (
                f"its RestartPolicy restarts {which} (restart {budget.used()} of "
                f"{policy.max_restarts} within {policy.window_s:g} s)"
            )
        else:
            consequence = (
                f"calls that include it fail until it is replaced: "
                f"{restart_ranks_hint(self._group.name, ranks)} (the other ranks keep their "
                f"state), or {restart_hint(self._group.name)} for every rank; healthy() is the "
                "view of the ranks still running"
            )
        error = MeshFailure(
            f"{what}; {consequence}", ranks=ranks, cause=cause, mesh=self._group.name
        )

        def mark() -> None:
            for rank in ranks:
                self._group.dead[rank] = error

        if not self.end_ranks(ranks, error, mark) and not quiet:
            _log.warning("monarch_nb: %s", error)  # nobody was waiting: say it here
        if self._group.events.observed:
            announce()
        if budget is None:
            # Up the tree as told by an actor that ran there (Monarch's events).
            told = naming_an_actor(self._group, ranks, error)
            _context.report_child_failure(self._group.owner, told)
            return
        self._group.schedule_restart(ranks, what)

    def _emit_exit(self, worker: WorkerProcess) -> None:
        assert worker.returncode is not None
        stopping = isinstance(self._group.state, Stopped)
        state = ev.RankState.STOPPED if stopping else ev.RankState.DEAD
        cause = worker.exit_cause()
        if not stopping:
            self._group.events.emit(
                ev.RankFailed(
                    self._group.name,
                    worker.rank,
                    cause,
                    traceback="\n".join(worker.fault_report),
                    returncode=worker.returncode,
                )
            )
        self._group.events.emit(ev.RankStateChanged(self._group.name, worker.rank, state, cause))

    def _identities(self) -> set[bytes]:
        return {w.identity for w in self._group.workers}

    def fail(self, error: MeshFailure) -> None:
        """Mark the group failed and fail every call in flight to it (I/O thread)."""
        if error.mesh is None:
            error.mesh = self._group.name
        failed_calls = self._group.controller.end_group(
            self._group, Failed(error), error, unless_ended=True
        )
        if failed_calls is None:
            return  # already failed, or stopped on purpose
        self._group.all_ready.set()
        if not failed_calls:
            _log.warning("monarch_nb: %s", error)  # nobody was waiting: say it here
        self._group.events.emit(ev.MeshFailed(self._group.name, error))
        _context.report_child_failure(self._group.owner, error)

    # -- stopping ---------------------------------------------------------------------

    def stop(self, grace: float | None = None) -> None:
        """Ask every worker to exit, kill what is left after ``grace`` s (blocking;
        default: the ``stop_grace`` setting, read now).

        Ranks still running user code are interrupted first: whoever waited for
        that work is told the mesh stopped, so finishing it would only delay
        the exit (a rank stuck in C is killed after ``grace``). A group that was
        resized stops the group it was resized into (``with`` blocks end it)."""
        if self._group.successor is not None:
            self._group.successor.stop(grace)
            return
        if isinstance(self._group.state, Stopped):
            return
        busy = tuple(
            w.rank
            for w in self._group.workers
            if w.returncode is None and self._group.rank_state(w.rank) is ev.RankState.BUSY
        )
        # Stopped first: a worker that exits on the shutdown must not look like a crash.
        self._group.controller.end_group(
            self._group,
            Stopped(),
            MeshFailure(
                f"process mesh {self._group.name!r} was stopped", ranks=self._group.shape.ranks
            ),
        )
        self._group.notify_restart()
        if busy:
            self._group.controller.send(
                self._group, busy, self._group.signer.encode(Interrupt(0)), even_if_failed=True
            )
        # A rank restarted meanwhile: stop its new process too.
        self.shut_down(list(self._group.workers), grace)

    def shut_down(self, workers: list[WorkerProcess], grace: float | None = None) -> None:
        """Ask ``workers`` to exit, kill those left after ``grace`` s (default:
        ``stop_grace``), and forget them (blocking; the group is stopped already, so
        no exit reads as a crash)."""
        if grace is None:
            grace = self._group.stop_grace_s
        live = tuple(w.rank for w in workers if w.returncode is None)
        if live:
            message = self._group.signer.encode(Shutdown())
            self._group.controller.send(self._group, live, message, even_if_failed=True)
        deadline = time.monotonic() + grace
        for w in workers:
            if not w.wait(max(0.0, deadline - time.monotonic())):
                w.kill()
                w.wait(KILL_WAIT_S)
        self.forget(workers)

    def kill(self) -> None:
        """Kill every worker at once (no grace), e.g. before a restart."""
        if self._group.resized_into is not None:
            return  # its processes live on in the group it was resized into
        if not isinstance(self._group.state, Stopped):
            self._group.controller.end_group(
                self._group,
                Stopped(),
                MeshFailure(
                    f"process mesh {self._group.name!r} was killed", ranks=self._group.shape.ranks
                ),
            )
        self._group.notify_restart()
        for w in self._group.workers:
            w.kill()
        for w in self._group.workers:
            w.wait(KILL_WAIT_S)
        self.forget(self._group.workers)

    def forget(self, workers: list[WorkerProcess]) -> None:
        def forget() -> None:
            for w in workers:
                self._group.controller.remove_peer(w.identity)
                if not isinstance(w, LocalWorker):
                    continue
                if w.pidfd >= 0:
                    self._group.controller.loop.remove_fd(w.pidfd)
                    os.close(w.pidfd)
                    w.pidfd = -1
                for pipe in (w.popen.stdout, w.popen.stderr):
                    if pipe is not None and not pipe.closed:
                        self._group.drain_output(w)
                        self._group.controller.loop.remove_fd(pipe.fileno())
                        pipe.close()

        self._group.controller.run(forget)

    def interrupt(self, ranks: Iterable[int], call_id: int = 0) -> None:
        """Stop call ``call_id`` on ``ranks`` (0: whatever user code runs there): a
        KeyboardInterrupt if it runs, answered as interrupted if still queued.
        Through the ranks' wire threads, so it works while they are busy, on any
        host, and on a failed mesh's surviving ranks."""
        live = tuple(r for r in ranks if self._group.workers[r].returncode is None)
        if live:
            message = self._group.signer.encode(Interrupt(call_id))
            self._group.controller.send(self._group, live, message, even_if_failed=True)

    def kill_ranks(self, ranks: Iterable[int], why: str | None = None) -> None:
        """SIGKILL ``ranks`` (a rank stuck in C ignores interrupts); the mesh fails.
        ``why``: monarch_nb kills them on purpose, and says so (their exit is then
        reported with that reason, not as a crash, and not logged again)."""
        for rank in ranks:
            worker = self._group.workers[rank]
            if worker.returncode is None:
                if why:
                    worker.killed_because = why
                worker.kill()

    def silent_ranks(self, ranks: Iterable[int]) -> dict[int, float]:
        """Of ``ranks``, those alive whose last heartbeat is older than
        ``SILENT_BEATS`` heartbeats, at least 3 s (rank -> seconds since it); any
        thread."""
        now = time.monotonic()
        silent_after = max(3.0, SILENT_BEATS * self._group.heartbeat_s)
        workers = self._group.workers
        silent = {}
        for rank in ranks:
            if rank >= len(workers) or workers[rank].returncode is not None:
                continue
            beat = workers[rank].heartbeat
            heard = beat[0] if beat is not None else workers[rank].started
            if now - heard > silent_after:
                silent[rank] = now - heard
        return silent
