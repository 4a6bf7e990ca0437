"""References to meshes: what an actor mesh or process mesh becomes on the wire.

A reference names the mesh and says how to reach each of its ranks, and is
small however large the mesh: the ranks of a view are kept as runs of
arithmetic progressions (one run for a whole mesh or a slice along one
dimension), and a rank's inbox address is the mesh's address prefix plus the
rank (``ipc://<run dir>/<group>-<generation>-<rank>``, see :mod:`._peer`).

Unpickled where the mesh lives (the process that spawned it), a reference
becomes that process's own mesh object again (the registry here); anywhere
else, a peer mesh that sends straight to the ranks' processes (the rebuild
functions pickles name live in :mod:`._peer_mesh`, above this module).
"""

from __future__ import annotations

import functools
import socket
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._model._shape import Shape
from . import _peer

Runs = tuple[tuple[int, int, int], ...]  # (first rank, step, count) each


def compact_ranks(ranks: Sequence[int]) -> Runs:
    """``ranks`` as runs of arithmetic progressions, in order."""
    runs: list[tuple[int, int, int]] = []
    i, n = 0, len(ranks)
    while i < n:
        first = ranks[i]
        if i + 1 == n:
            runs.append((first, 1, 1))
            break
        step = ranks[i + 1] - first
        count = 2
        while i + count < n and ranks[i + count] - ranks[i + count - 1] == step:
            count += 1
        runs.append((first, step, count))
        i += count
    return tuple(runs)


def expand_ranks(runs: Runs) -> list[int]:
    return [first + step * k for first, step, count in runs for k in range(count)]


@dataclass(frozen=True, slots=True)
class ViewRef:
    """A view (slice) of a mesh: dimension names, sizes, and its ranks as runs."""

    labels: tuple[str, ...]
    sizes: tuple[int, ...]
    runs: Runs

    @classmethod
    def of(cls, shape: Shape) -> ViewRef:
        return cls(shape.labels, shape.sizes, compact_ranks(shape.ranks))

    def shape(self) -> Shape:
        return Shape(self.labels, self.sizes, expand_ranks(self.runs))


# Where the ranks of a mesh on several hosts listen: per host address, its
# ranks' TCP ports as runs of (first rank, first port, count), both counting up.
Table = tuple[tuple[str, tuple[tuple[int, int, int], ...]], ...]


def compact_table(addresses: dict[int, str]) -> Table:
    """``{rank: "tcp://host:port"}`` as a :data:`Table` (small when ports are in order)."""
    by_host: dict[str, list[tuple[int, int]]] = {}
    for rank in sorted(addresses):
        host, port_text = addresses[rank].removeprefix("tcp://").rsplit(":", 1)
        by_host.setdefault(host, []).append((rank, int(port_text)))
    table = []
    for host, pairs in by_host.items():
        runs: list[tuple[int, int, int]] = []
        for rank, port in pairs:
            if runs:
                first_rank, first_port, count = runs[-1]
                if rank == first_rank + count and port == first_port + count:
                    runs[-1] = (first_rank, first_port, count + 1)
                    continue
            runs.append((rank, port, 1))
        table.append((host, tuple(runs)))
    return tuple(table)


@functools.lru_cache(maxsize=64)
def _table_lookup(table: Table) -> dict[int, str]:
    return {
        first_rank + k: f"tcp://{host}:{first_port + k}"
        for host, runs in table
        for first_rank, first_port, count in runs
        for k in range(count)
    }


@dataclass(frozen=True, slots=True)
class ProcsRef:
    """One generation of a process group: where its ranks' inboxes are.

    On one host, a rank's inbox is ``prefix + str(rank)`` (a socket in the
    run directory); across hosts, ``table`` lists each host's TCP ports. A
    resized mesh keeps the inboxes its processes bound under their old ranks:
    ``inboxes`` lists every rank's address.
    """

    group: str  # the group's random id
    generation: int
    name: str  # the mesh's name, for messages
    host: str  # the host whose run directory holds the inboxes
    prefix: str  # a rank's inbox address is prefix + str(rank)
    world: ViewRef  # the whole group's shape
    table: Table = ()  # a mesh on several hosts: where each rank listens
    inboxes: tuple[str, ...] = ()  # a resized mesh: each rank's address, by rank
    tree: str = ""  # the tree whose key its ranks accept (_peer.tree_id); "" unknown

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcsRef:
        """Back from the JSON of a worker's bootstrap (lists where tuples were)."""
        world = data["world"]
        return cls(
            data["group"],
            data["generation"],
            data["name"],
            data["host"],
            data["prefix"],
            ViewRef(
                tuple(world["labels"]),
                tuple(world["sizes"]),
                tuple(tuple(run) for run in world["runs"]),
            ),
            tuple(
                (host, tuple(tuple(run) for run in runs)) for host, runs in data.get("table", ())
            ),
            tuple(data.get("inboxes", ())),
            data.get("tree", ""),
        )

    def address(self, rank: int) -> str:
        if self.inboxes:
            return self.inboxes[rank]
        if self.table:
            return _table_lookup(self.table)[rank]
        return f"{self.prefix}{rank}"

    def check_reachable(self) -> None:
        from .._model._errors import MeshUsageError

        if not self.table and self.host != socket.gethostname():
            raise MeshUsageError(
                f"mesh {self.name!r} has its inboxes on host {self.host!r} only: "
                "pass references from the controller that started it"
            )
        if self.tree and self.tree != _peer.tree_id():
            # Its ranks check every message against their tree's key, and drop
            # what another's signs: without this the call would wait forever.
            raise MeshUsageError(
                f"process mesh {self.name!r} belongs to another monarch_nb client (a "
                "process tree with its own key, such as the one that pickled it into this "
                "process): its ranks accept messages only from that client and the "
                "processes it started. Use it there (that client, or an actor it spawned), "
                "or spawn processes of this client's own: this_host().spawn_procs(...)"
            )


@dataclass(frozen=True, slots=True)
class ActorRef:
    """An actor mesh: which actor in which processes, and what it answers."""

    procs: ProcsRef
    actor_id: int
    name: str
    cls_name: str
    endpoints: tuple[str, ...]
    spawned: ViewRef  # the shape it was spawned on (message_rank is relative to a slice)


# Meshes this process owns, so that a reference coming back rebuilds the real
# object: (group, generation) -> process mesh view maker, and
# (group, generation, actor id) -> actor mesh view maker.
_local_procs: dict[tuple[str, int], Callable[[Shape], Any]] = {}
_local_actors: dict[tuple[str, int, int], Callable[[Shape], Any]] = {}
_local_lock = threading.Lock()


def register_procs(ref: ProcsRef, owner: Any, view: Callable[[Any, Shape], Any]) -> None:
    """``view(owner, shape)`` rebuilds this process's own process mesh from a reference
    (held weakly: a forgotten mesh is not kept alive by having been sent)."""
    _register(_local_procs, (ref.group, ref.generation), owner, view)


def register_actors(ref: ActorRef, owner: Any, view: Callable[[Any, Shape], Any]) -> None:
    key = (ref.procs.group, ref.procs.generation, ref.actor_id)
    _register(_local_actors, key, owner, view)


def _register(table: dict, key: Any, owner: Any, view: Callable[[Any, Shape], Any]) -> None:
    with _local_lock:
        if key in table:  # sent before, and still alive (a dead owner unregisters)
            return
    owner_ref = weakref.ref(owner)

    def make(shape: Shape) -> Any:
        live = owner_ref()
        return None if live is None else view(live, shape)

    with _local_lock:
        table[key] = make
    weakref.finalize(owner, _forget, table, key, make)


def _forget(table: dict, key: Any, make: Any) -> None:
    with _local_lock:
        if table.get(key) is make:
            del table[key]


def local_procs(ref: ProcsRef, shape: Shape) -> Any:
    """This process's own process mesh view of ``shape`` if it owns ``ref``, else None
    (the caller, :mod:`._peer_mesh`, then makes a peer mesh)."""
    with _local_lock:
        make = _local_procs.get((ref.group, ref.generation))
    return make(shape) if make is not None else None


def local_actors(ref: ActorRef, shape: Shape) -> Any:
    """This process's own actor mesh view of ``shape`` if it owns ``ref``, else None."""
    with _local_lock:
        make = _local_actors.get((ref.procs.group, ref.procs.generation, ref.actor_id))
    return make(shape) if make is not None else None
