"""A process group's state as data: the snapshot ``status()`` returns (see :mod:`._status`)."""

from __future__ import annotations

import time

from . import _events as ev
from ._group_core import GroupCore
from ._lifecycle import Failed, Running, Starting, Stopped
from ._status import MeshState, MeshStatus, RankStatus
from ._workers import WorkerProcess


def mesh_status(group: GroupCore, ranks: tuple[int, ...]) -> MeshStatus:
    """A snapshot of ``ranks`` (any thread; see :mod:`._status`)."""
    now = time.monotonic()
    state, failure = mesh_state(group, ranks)
    rows = []
    for rank in ranks:
        worker = group.workers[rank] if rank < len(group.workers) else None
        if worker is None:
            continue
        rows.append(_rank_status(group, rank, worker, now))
    return MeshStatus(
        group.name,
        state,
        failure,
        group.shape,
        tuple(rows),
        group.controller.stats.snapshot(),
        time.time(),
        tuple(group.restarts),
    )


def mesh_state(
    group: GroupCore, ranks: tuple[int, ...] | None = None
) -> tuple[MeshState, str | None]:
    """The state of the view over ``ranks`` (default: every rank): failed if one
    of them is dead, starting while one restarts."""
    match group.state:
        case Starting():
            return MeshState.STARTING, None
        case Running():
            view = group.shape.ranks if ranks is None else ranks
            if any(r in group.restarting for r in view):
                return MeshState.STARTING, None
            error = group.rank_failure(view)
            if error is not None:
                return MeshState.FAILED, str(error)
            return MeshState.RUNNING, None
        case Failed(error):
            return MeshState.FAILED, str(error)
        case Stopped():
            if group.replacing_all:
                return MeshState.STARTING, None
            return MeshState.STOPPED, None
    raise AssertionError(group.state)


def _rank_status(group: GroupCore, rank: int, worker: WorkerProcess, now: float) -> RankStatus:
    state = group.rank_state(rank)
    failure = group.rank_failures.get(rank)
    if worker.returncode is not None:
        failure = failure or worker.exit_cause()
    beat, before = worker.heartbeat, worker.previous_heartbeat
    sample = beat[1] if beat else None
    cpu = None
    if beat and before:  # the rank's own clock: a late delivery does not skew it
        elapsed = beat[1].sampled_at - before[1].sampled_at
        if elapsed > 0.05:
            cpu = 100.0 * (beat[1].cpu_seconds - before[1].cpu_seconds) / elapsed
    work, work_seconds = "", 0.0
    if state in (ev.RankState.BUSY, ev.RankState.PAUSED):
        if beat and worker.work:  # the rank's own word, aged by the time since it said it
            work, work_seconds = worker.work, worker.work_seconds + (now - beat[0])
        else:
            waiting = group.controller.calls_waiting_on(group, rank)
            work = waiting[0] if waiting else "call"
    return RankStatus(
        rank=rank,
        point=group.shape.point_of_rank(rank),
        host=group.hosts.get(rank, worker.host),
        pid=worker.pid,
        state=state,
        work=work,
        work_seconds=work_seconds,
        cpu_percent=cpu,
        rss_bytes=sample.rss_bytes if sample else None,
        gpu_memory_allocated=sample.gpu_memory_allocated if sample else None,
        gpu_memory_reserved=sample.gpu_memory_reserved if sample else None,
        gpu_utilization=sample.gpu_utilization if sample else None,
        heartbeat_age=(now - beat[0]) if beat else None,
        returncode=worker.returncode,
        failure=failure,
    )
