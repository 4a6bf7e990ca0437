"""Sending a mesh's history again to new processes: ``restart(replay=True)``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from .._model._errors import ReplayError
from .._model._fold import format_ranks
from .._model._shape import Shape
from . import _cells
from ._history import Step
from ._interrupt import wait_for

if TYPE_CHECKING:
    from ._process_group import ProcGroup


class Replayable(Protocol):
    """What a replay needs of a process mesh (a ProcMesh is one): its processes, its
    name for errors, and views of it to send each step to."""

    _group: ProcGroup

    @property
    def name(self) -> str: ...

    def _new_with_shape(self, shape: Shape) -> _cells.CellTarget: ...


# Told of each step before it is sent: (its place, 1-based, how many there are, the step).
StepHook = Callable[[int, int, Step], None]


def replay(
    procs: Replayable,
    ranks: tuple[int, ...],
    *,
    spawns: bool,
    on_step: StepHook | None = None,
    skip: Callable[[Step], bool] | None = None,
) -> tuple[str, ...]:
    """Send the replayable steps of ``procs``' history to ``ranks`` (just restarted),
    in order, each to the part of its view on ``ranks``; wait for each. Spawns
    are sent only if ``spawns`` (a partial restart spawned its actors again
    already). Returns the labels of the steps sent; raises ReplayError naming
    the first step that failed (the ones after it are not sent).

    ``on_step(i, n, step)`` is called before each step is sent (a notebook's
    header); ``skip(step)`` true leaves a step out (a cell that only displays)."""
    group = procs._group
    history = group.history
    if history.dropped:
        raise ReplayError(
            f"process mesh {procs.name!r} has a history longer than can be kept "
            f"({history.dropped} step(s) were not recorded), so it cannot be replayed: "
            "build the state again yourself (run the notebook's cells)",
            step=None,
        )
    steps = [
        s
        for s in history.to_replay(ranks)
        if (s.kind != "spawn" or spawns) and (skip is None or not skip(s))
    ]
    sent: list[str] = []
    for index, step in enumerate(steps):
        shape = _on_ranks(step.shape, ranks)
        if on_step is not None:
            on_step(index + 1, len(steps), step)
        try:
            _send(procs, step, shape)
        except BaseException as exc:
            rest = len(steps) - index - 1
            raise ReplayError(
                f"replaying step {step.number} of process mesh {procs.name!r} ({step.label} "
                f"on ranks {format_ranks(shape.ranks)}) failed: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}; {len(sent)} step(s) before it "
                f"were replayed and the {rest} after it were not. Fix what it needs and run "
                f"it again, then the cells after it (%mesh history lists them)",
                step=step.number,
            ) from exc
        sent.append(step.label)
    return tuple(sent)


def _on_ranks(shape: Shape, ranks: tuple[int, ...]) -> Shape:
    """``shape`` if all of it restarted, else its ranks among ``ranks`` (one dimension)."""
    if set(shape.ranks) <= set(ranks):
        return shape
    chosen = tuple(r for r in shape.ranks if r in ranks)
    return Shape(("ranks",), (len(chosen),), chosen)


def _send(procs: Replayable, step: Step, shape: Shape) -> None:
    view = procs._new_with_shape(shape)
    match step.kind:
        case "cell":
            filename, source = step.payload
            wait_for(_cells.run_cell(view, source, name=filename, record=False))
        case "push":
            wait_for(_cells.push(view, step.payload, record=False))
        case "spawn":
            actor_id, record = step.payload
            on = tuple(r for r in shape.ranks if r not in record.stopped)
            if on:
                group = procs._group
                wait_for(group.spawn_again(actor_id, record, on))
                group.spawned[actor_id] = dataclasses.replace(record, stopped=set(record.stopped))
                group.replayed_actors[actor_id] = group.generation
