"""Elastic meshes: ``resize(procs=n)`` and ``grow(n)`` make a new process mesh.

A resize keeps running processes and renumbers them: the survivors of a
failure (or the first ``n`` of them) become ranks ``0..n-1`` of a new
:class:`~._process_group.ProcGroup`, which *adopts* them (their routing
identities, pipes and exit watchers move over; their signing key and
replay windows stay), and ``grow`` starts processes for the ranks added
after them. Each adopted rank is told its new rank, shape and environment
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, a fresh ``MASTER_PORT``) by a
:class:`~.._wire._messages.Renumber` call, so its namespace (``rank``,
``world_size``, ``point``) and ``current_rank()`` follow; its namespace is
kept, and it leaves its torch.distributed process group, if it had one.
The group it left is stopped, "resized into" the new one: calls to it, and
to the actor meshes on it, say to use the new mesh. Actors do not follow a
renumbering: the old mesh's actors are stopped.

Meshes are values: the old :class:`~._proc_mesh.ProcMesh` is not changed
into the new one; ``resize`` and ``grow`` return the new group, which the
caller wraps in a mesh. Only meshes on this host can be resized (a
multi-host mesh's processes are started by agents that number them by host).
"""

from __future__ import annotations

import functools
import secrets
import time

from .._model._errors import MeshFailure, MeshUsageError
from .._model._shape import Shape
from .._services._config import COLLECTIVE_TIMEOUT_S, collective_timeout
from .._services._dist import STORE_ENV, fresh_store_path
from .._wire._messages import Renumber
from .._wire._network import free_port
from ._calls import send_call
from ._lifecycle import Failed, Running, Starting, Stopped, describe_ranks
from ._process_group import START_TIMEOUT_S, ProcGroup
from ._workers import LocalWorker, WorkerProcess


def resize(group: ProcGroup, procs: int) -> ProcGroup:
    """A new group of ``procs`` ranks over the first ``procs`` live ranks of ``group``'s
    processes (the others are stopped); see :meth:`ProcMesh.resize`."""
    call = f"resize(procs={procs!r})"
    _check_count(call, procs, 1)
    live = _check_resizable(group, call)
    if procs > len(live):
        raise MeshUsageError(
            f"{call}: process mesh {group.name!r} has {len(live)} live rank(s) "
            f"({describe_ranks(live)}); resize() keeps running processes and starts none: "
            f"use grow({procs - len(live)}) to add ranks"
        )
    return _reshape(group, live[:procs], 0)


def grow(group: ProcGroup, count: int) -> ProcGroup:
    """A new group of ``group``'s live ranks and ``count`` new processes after them;
    see :meth:`ProcMesh.grow`."""
    call = f"grow({count!r})"
    _check_count(call, count, 1)
    live = _check_resizable(group, call)
    if group.gpus:
        raise MeshUsageError(
            f"{call}: process mesh {group.name!r} has one GPU per rank, and grow() does not "
            "pick GPUs for new ranks yet; start a new mesh with more GPUs"
        )
    return _reshape(group, live, count)


def _check_count(call: str, value: object, least: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise MeshUsageError(f"{call}: needs an int of at least {least}, got {value!r}")


def _check_resizable(group: ProcGroup, call: str) -> tuple[int, ...]:
    """The live ranks of ``group``, or MeshUsageError saying why it cannot be resized."""
    if group.agents is not None:
        raise MeshUsageError(
            f"{call}: process mesh {group.name!r} runs on several hosts, and only meshes on "
            "this host can be resized; restart() replaces every process"
        )
    match group.state:
        case Stopped():
            raise MeshUsageError(f"{call}: process mesh {group.name!r} was stopped")
        case Failed(error):
            raise MeshUsageError(
                f"{call}: process mesh {group.name!r} failed as a whole ({error}); restart() "
                "replaces every process"
            )
        case Starting():
            raise MeshUsageError(f"{call}: process mesh {group.name!r} is starting; wait for it")
    if group.restarting:
        raise MeshUsageError(
            f"{call}: rank(s) {describe_ranks(tuple(sorted(group.restarting)))} of process "
            f"mesh {group.name!r} are restarting; call again once the restart is done"
        )
    live = tuple(
        r for r in group.live_ranks(group.shape.ranks) if group.workers[r].returncode is None
    )
    if not live:
        raise MeshUsageError(f"{call}: no rank of process mesh {group.name!r} is alive")
    return live


def _reshape(old: ProcGroup, keep: tuple[int, ...], add: int) -> ProcGroup:
    size = len(keep) + add
    label = old.shape.labels[0] if len(old.shape.labels) == 1 else "procs"
    controller = old.controller
    new = ProcGroup(
        {label: size},
        controller=controller,
        env=old.extra_env,
        gpus=old.gpus,
        name=old.name,
        restart=old.restart_policy,
    )
    # The same mesh to whoever watches it (echoed output, a dashboard, a log).
    new.events = old.events
    new.owner = old.owner
    new.generation = 1
    new._key, new.signer = old._key, old.signer  # what the adopted processes verify
    host = controller.bind_host
    new._env = dict(
        old._env,
        WORLD_SIZE=str(size),
        LOCAL_WORLD_SIZE=str(size),
        MASTER_PORT=str(free_port(host)),
    )
    if STORE_ENV in new._env:  # a new process group meets in a new file (one host)
        new._env[STORE_ENV] = fresh_store_path()
    old_ref = old.launcher.local_ref()
    new.inboxes = {i: old_ref.address(r) for i, r in enumerate(keep)}
    new.hosts = {i: old.hosts[r] for i, r in enumerate(keep) if r in old.hosts}
    new.after_restart = list(old.after_restart)
    new.ready_ranks = set(range(len(keep)))
    new.state = Running()
    moved = ", ".join(f"{r}->{i}" for i, r in enumerate(keep))
    described = f"a mesh of {size} rank(s) (ranks moved: {moved}{f'; {add} added' if add else ''})"

    # The old group stops (its calls in flight fail, saying where its processes
    # went) before any process moves, so no exit below reads as a crash.
    old.resized_into = described
    old.successor = new
    busy = tuple(r for r in keep if old.controller.outstanding.get((old.id, r), 0) > 0)
    controller.end_group(
        old,
        Stopped(),
        MeshFailure(f"process mesh {old.name!r} was resized into {described}", ranks=keep),
    )
    old.notify_restart()
    controller.groups.discard(old)
    if busy:
        old.interrupt(busy)
    old.shut_down([w for w in old.workers if w.rank not in keep])
    lost: list[WorkerProcess] = []
    controller.run(lambda: lost.extend(_adopt(old, new, keep)))
    try:
        _renumber(new, range(len(keep)))
        if add:
            _start_added(new, range(len(keep), size))
    except BaseException:
        new.stop()
        raise
    for worker in lost:  # died while moving: dead in the new mesh, as any rank that dies
        controller.run(functools.partial(new.worker_exited, worker))
    return new


def _adopt(old: ProcGroup, new: ProcGroup, keep: tuple[int, ...]) -> list[WorkerProcess]:
    """Move the processes of ``keep`` to ``new`` as ranks 0.. (I/O thread); those that
    exited meanwhile (their exit already handled by ``old``)."""
    loop = old.controller.loop
    lost: list[WorkerProcess] = []
    for new_rank, rank in enumerate(keep):
        worker = old.workers[rank]
        assert isinstance(worker, LocalWorker)
        for pipe in (worker.popen.stdout, worker.popen.stderr):
            if pipe is not None and not pipe.closed:
                loop.remove_fd(pipe.fileno())
        if worker.pidfd >= 0:
            loop.remove_fd(worker.pidfd)
        worker.rank = new_rank
        old.controller.move_peer(worker.identity, new, new_rank)
        new.workers.append(worker)
        if worker.pidfd < 0:
            lost.append(worker)
            continue
        new.watch_one(worker)
    return lost


def _renumber(new: ProcGroup, ranks: range) -> None:
    """Tell each adopted rank its new place, and wait until each took it."""
    ref = new.launcher.local_ref()
    keys = ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_PORT", STORE_ENV)
    env = {k: new._env[k] for k in keys if k in new._env}
    futures = []
    for rank in ranks:
        payload = {
            "rank": rank,
            "labels": new.shape.labels,
            "sizes": new.shape.sizes,
            "env": dict(env, RANK=str(rank), LOCAL_RANK=str(rank)),
            "ref": ref,
        }
        futures.append(
            send_call(
                new,
                Shape(("ranks",), (1,), (rank,)),
                Renumber,
                payload,
                actor=f"renumber as rank {rank}",
            ).future
        )
    # A kept rank may still be in a collective the dead rank left (gloo frees only
    # the dead rank's neighbours at once; the others wait for torch.distributed's
    # timeout): its renumber runs after that, so it may take that long too.
    try:
        in_collective_s = collective_timeout()
    except MeshUsageError:  # a bad value fails the mesh's start, not its resize
        in_collective_s = COLLECTIVE_TIMEOUT_S
    deadline = time.monotonic() + START_TIMEOUT_S + in_collective_s
    for future in futures:
        future.get(timeout=max(0.0, deadline - time.monotonic()))


def _start_added(new: ProcGroup, ranks: range) -> None:
    """Start processes for ``ranks`` (the ranks ``grow`` adds); wait for their hello."""
    added = tuple(ranks)
    new.restarting.update(added)  # until they said hello: calls to them say so

    def launch() -> None:
        for rank in added:
            identity = f"w{secrets.token_hex(16)}.{rank}".encode()
            new.controller.add_peer(identity, new, rank, None)
            worker = new.launch(rank, identity, new._key, new._env)
            new.workers.append(worker)
            new.watch_one(worker)

    new.controller.run(launch)

    def settled() -> bool:
        return all(r in new.ready_ranks or r in new.restart_failed for r in added)

    with new.restarter.ready_changed:
        new.restarter.ready_changed.wait_for(settled, START_TIMEOUT_S)
    new.restarting.difference_update(added)
    failed = {r: new.restart_failed.get(r) for r in added if r not in new.ready_ranks}
    if failed:
        why = "; ".join(
            f"rank {r}: {text or f'no hello within {START_TIMEOUT_S} s'}"
            for r, text in failed.items()
        )
        raise MeshFailure(
            f"grow(): could not start rank(s) {describe_ranks(tuple(failed))} of process mesh "
            f"{new.name!r} ({why}); the mesh was stopped",
            ranks=tuple(failed),
        )
