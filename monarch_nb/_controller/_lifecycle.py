"""A process group's life cycle: its states, and what a restart spawns again.

A small closed set of states (see :mod:`._process_group`)::

    Starting -> Running -> Failed(cause) -> (restart) Starting ...
                        \\-> Stopped

Low in the controller: the client reads a group's state to end it, and every
role of a group (launching, liveness, restarts) reads it too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._model._errors import MeshFailure


@dataclass(frozen=True)
class Starting:
    pass


@dataclass(frozen=True)
class Running:
    pass


@dataclass(frozen=True)
class Failed:
    error: MeshFailure


@dataclass(frozen=True)
class Stopped:
    pass


State = Starting | Running | Failed | Stopped


@dataclass
class SpawnRecord:
    """How an actor mesh was spawned, to spawn it again on ranks that restart."""

    name: str
    cls: type
    args: tuple
    kwargs: dict
    labels: tuple[str, ...]
    sizes: tuple[int, ...]
    ranks: tuple[int, ...]
    stopped: set[int] = field(default_factory=set)  # ranks whose actor was stopped


def plural_ranks(ranks: tuple[int, ...]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {describe_ranks(ranks)}"


def describe_ranks(ranks: tuple[int, ...]) -> str:
    if len(ranks) > 2 and ranks == tuple(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))
