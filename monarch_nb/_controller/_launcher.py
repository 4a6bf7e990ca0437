"""Starting a process group's workers: one process per rank, each told who it is.

Every worker gets its bootstrap (signing key included) through a stdin pipe,
so no secret is ever on a command line; local workers are watched from the
I/O thread (a pidfd for the exit, the stdout/stderr pipes for output), and a
multi-host group's workers are started by its host agents.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import secrets
import socket
from typing import Any

from .._model._errors import MeshFailure
from .._runtime import _peer, _refs
from .._services._dist import STORE_ENV, fresh_store_path
from .._services._spawn import start_local_worker
from .._wire import _rundir
from .._wire._network import free_port, interface_of, visible_gpus
from .._wire._signed import CONTROLLER, Signer, new_key
from .._wire._unix_link import SCHEME as LINK_SCHEME
from . import _events as ev
from ._group_core import GroupCore
from ._lifecycle import Failed, Starting
from ._workers import LocalWorker


class Launcher:
    """Starts a group's workers (every rank, or one again) and watches them."""

    def __init__(self, group: GroupCore) -> None:
        self._group = group

    def start(self) -> None:
        """Start every worker and wait until each said hello (blocking)."""
        key = new_key()
        # Through agents, every hop is trusted (CURVE, then the agent's private
        # Unix socket); children of ours are, unless MONARCH_NB_BIND made their
        # link a plain TCP port (see _wire's docstring).
        trusted = self._group.agents is not None or self._group.controller.address.startswith(
            ("ipc://", LINK_SCHEME)
        )
        signer = Signer(
            key,
            self._group.controller.stats,
            sender=CONTROLLER,
            upstream=False,
            trusted_link=trusted,
        )
        # Under the lock senders hold: a send sees the old generation whole (its
        # state, workers and signer) or the new one refusing calls while it
        # starts, never the new empty worker list behind the old state.
        with self._group.controller.send_lock:
            self._group.generation += 1
            self._group.state = Starting()
            self._group.actor_failures.clear()
            self._group.init_failures.clear()
            self._group.rank_failures.clear()
            self._group.paused.clear()
            self._group.idle_since.clear()
            self._group.dead.clear()
            self._group.spawned.clear()
            self._group.missing_actors.clear()
            self._group.restarting.clear()
            self._group.inboxes = {}
            self._group.hosts = {}
            self._group.peer_addresses = {}
            self._group.workers = []  # the new generation's, once launched
            self._group._key, self._group.signer = key, signer
        self._group.all_ready.clear()
        self._group.ready_ranks = set()
        ranks = range(len(self._group.shape))
        # Random routing ids (128 bits each): another local user who could guess
        # them could connect first under a worker's name and make its real hello
        # unroutable (a restart that "did not start"). They travel on the bootstrap pipe.
        identities = [f"w{secrets.token_hex(16)}.{rank}".encode() for rank in ranks]
        # Known before any worker exists: a fast worker's hello must not find
        # its identity unknown (and be dropped) while we still start the others.
        self._group.controller.run(lambda: self._register_peers(identities))
        if self._group.agents is not None:
            agents = self._group.agents
            self._group.controller.run(
                lambda: agents.launch(self._group, identities, self._bootstrap(key))
            )
        else:
            base_env = self._group._env = self._base_env()
            # Launched from the I/O thread, which lives as long as the controller: a
            # worker's parent-death signal fires when the *thread* that forked it
            # ends, and a caller's thread may end long before the mesh does. Listed
            # in the same turn of that thread, which also handles the workers'
            # hellos: the last hello (the mesh is Running from then) always finds
            # them listed. Two turns let a call racing a restart find a running mesh
            # with no workers (an IndexError in the caller's send).
            self._group.controller.run(
                lambda: self._watch(self._launch_all(ranks, identities, key, base_env))
            )
        if self._group.events.observed:
            for rank in ranks:
                self._group.events.emit(
                    ev.RankStateChanged(self._group.name, rank, ev.RankState.STARTING)
                )
        if not self._group.all_ready.wait(self._group.start_timeout_s):
            self._group.kill()
            raise MeshFailure(
                f"{self._group.name}: workers did not start within {self._group.start_timeout_s} s "
                "(set MONARCH_NB_START_TIMEOUT to wait longer)",
                ranks=self._group.shape.ranks,
            )
        if isinstance(self._group.state, Failed):
            error = self._group.state.error
            self._group.kill()  # the ranks that did start must not outlive a failed start
            raise error

    def _base_env(self) -> dict[str, str]:
        env = dict(os.environ)
        # The tree's private socket directory: a worker that starts meshes of its
        # own puts their inboxes there too (and never makes, or leaks, one).
        env[_rundir.ENV_VAR] = _rundir.run_dir()
        env[_rundir.TREE_ROOT_ENV] = str(_rundir.tree_root())
        # torch's CPU allocator on transparent huge pages: one-sided reads of a
        # rank's tensors (RDMABuffer) walk 2 MiB pages, not 4 KiB ones, and run
        # about twice as fast here. The user's own setting wins.
        env.setdefault("THP_MEM_ALLOC_ENABLE", "1")
        if self._group.agents is None:  # one host: torch.distributed meets in a private file
            env[STORE_ENV] = fresh_store_path()
        # ... and a user's own init_process_group (env://) on loopback: its store
        # (the worker keeps it there, see _dist) and gloo's and NCCL's sockets,
        # unless the user chose an interface.
        host = "127.0.0.1"  # every rank is on this host
        loopback = interface_of(host)
        if loopback is not None:
            env.setdefault("GLOO_SOCKET_IFNAME", loopback)
            env.setdefault("NCCL_SOCKET_IFNAME", loopback)
        env.update(
            WORLD_SIZE=str(len(self._group.shape)),
            LOCAL_WORLD_SIZE=str(len(self._group.shape)),
            MASTER_ADDR=host,
            MASTER_PORT=str(free_port(host)),
            PYTHONUNBUFFERED="1",
        )
        env.update(self._group.extra_env)
        return env

    def _bootstrap(self, key: bytes) -> dict[str, Any]:
        """What every worker of this generation reads on stdin (per rank: add
        ``identity`` and ``rank``; the launcher adds ``address`` and ``controller_pid``)."""
        boot = {
            "key": key.hex(),
            "shape": [list(self._group.shape.labels), list(self._group.shape.sizes)],
            "mesh": self._group.name,
            "heartbeat_s": self._group.configured_heartbeat_s,
            "imports": list(self._group.worker_imports),
            **self._group.boot_extras,  # spawn_procs(bootstrap=, proc_bind=), the interpreter
        }
        self._group.heartbeat_s = (
            self._group.configured_heartbeat_s
        )  # this generation's beat, for silent_ranks()
        # Actor-to-actor messages: each rank binds an inbox (prefix + rank on this
        # host; a TCP port it reports in its hello on other hosts).
        boot["peer"] = {
            "ref": dataclasses.asdict(self.local_ref()),
            "key": _peer.tree_key().hex(),
            "curve": _peer.tree_curve(),
            "tcp": self._group.agents is not None,
        }
        if self._group.agents is not None:  # ports opened here must be reachable from there
            _peer.local_node().listen_tcp(self._group.agents.bind_host())
        return boot

    def local_ref(self) -> _refs.ProcsRef:
        prefix = _rundir.socket_path(f"{self._group.uid}-{self._group.generation}-")
        inboxes: tuple[str, ...] = ()
        if self._group.inboxes:
            inboxes = tuple(
                self._group.inboxes.get(r, f"{prefix}{r}") for r in self._group.shape.ranks
            )
        return _refs.ProcsRef(
            self._group.uid,
            self._group.generation,
            self._group.name,
            socket.gethostname(),
            prefix,
            _refs.ViewRef.of(self._group.shape),
            inboxes=inboxes,
            tree=_peer.tree_id(),
        )

    def ref(self) -> _refs.ProcsRef | None:
        """What a reference to this generation's processes carries; None while a
        rank on another host has not said where it listens."""
        ref = self.local_ref()
        if self._group.agents is None:
            return ref
        addresses = dict(self._group.peer_addresses)
        if len(addresses) < len(self._group.shape):
            return None
        return dataclasses.replace(ref, table=_refs.compact_table(addresses))

    def _launch_all(
        self, ranks: range, identities: list[bytes], key: bytes, base_env: dict[str, str]
    ) -> list[LocalWorker]:
        """Start every rank, or none: a launch that fails part way (a process limit,
        no memory) kills the ranks it already started before it raises."""
        launched: list[LocalWorker] = []
        try:
            for rank in ranks:
                launched.append(self.launch(rank, identities[rank], key, base_env))
        except Exception as exc:
            for worker in launched:
                worker.popen.kill()
            for worker in launched:
                worker.wait(None)
            self._group.state = Failed(
                MeshFailure(f"{self._group.name}: could not start rank {len(launched)}: {exc}")
            )
            raise MeshFailure(
                f"{self._group.name}: could not start rank {len(launched)} of {len(ranks)} "
                f"({type(exc).__name__}: {exc}); the {len(launched)} already started were "
                "stopped. Start fewer processes, or raise the limit that refused this one",
                ranks=list(ranks),
            ) from exc
        return launched

    def launch(
        self, rank: int, identity: bytes, key: bytes, base_env: dict[str, str]
    ) -> LocalWorker:
        env = dict(base_env, RANK=str(rank), LOCAL_RANK=str(rank))
        if self._group.gpus:
            env["CUDA_VISIBLE_DEVICES"] = visible_gpus()[rank]
        bootstrap = dict(
            self._bootstrap(key),
            address=self._group.controller.address,
            identity=identity.decode(),
            rank=rank,
            controller_pid=os.getpid(),
        )
        popen = start_local_worker(env, bootstrap)
        return LocalWorker(rank, identity, popen)

    def _register_peers(self, identities: list[bytes]) -> None:
        agents = self._group.agents
        for rank, identity in enumerate(identities):
            via = agents.route_of_rank(self._group, rank) if agents is not None else None
            self._group.controller.add_peer(identity, self._group, rank, via)

    def _watch(self, workers: list[LocalWorker]) -> None:
        self._group.workers = list(workers)
        for w in workers:
            self.watch_one(w)

    def watch_one(self, w: LocalWorker) -> None:
        loop = self._group.controller.loop
        loop.add_fd(w.pidfd, functools.partial(self._group.on_exit, w))
        for name, pipe in (("stdout", w.popen.stdout), ("stderr", w.popen.stderr)):
            assert pipe is not None
            os.set_blocking(pipe.fileno(), False)
            loop.add_fd(pipe.fileno(), functools.partial(self._group.read_output, w, name, pipe))
