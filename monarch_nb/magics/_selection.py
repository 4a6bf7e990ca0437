"""Which ranks a cell runs on: ``--ranks 0,2-3`` and ``--where procs=0:2`` parsed to views.

Plain Python (no IPython) so the Python API and the magics share it. Bad input
raises :class:`SelectionError` naming the bad value; the magics turn it into
IPython's UsageError.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._model._errors import MeshUsageError, format_ranks

if TYPE_CHECKING:
    from .._controller._proc_mesh import ProcMesh


class SelectionError(MeshUsageError):
    """A rank list or ``--where`` clause that does not describe ranks of this mesh."""


def parse_ranks(text: str, size: int | None = None, mesh: str = "this mesh") -> list[int]:
    """``"0,2-3"`` -> ``[0, 2, 3]``; raises SelectionError on anything else.

    With ``size`` (the mesh's number of ranks), a rank outside it is refused
    before any range is expanded: a typo like ``0-99999999`` costs nothing.
    """
    ranks: list[int] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        first, dash, last = part.partition("-")
        try:
            lo = int(first)
            hi = int(last) if dash else lo
        except ValueError:
            raise SelectionError(
                f"--ranks {text!r}: {part!r} is not a rank or a range like 2-3"
            ) from None
        if lo < 0 or hi < lo:
            raise SelectionError(f"--ranks {text!r}: {part!r} is not a valid range")
        if size is not None and hi >= size:
            raise SelectionError(
                f"--ranks {text!r}: {mesh} has ranks 0-{size - 1}, not {hi} (nothing was expanded)"
            )
        ranks.extend(range(lo, hi + 1))
    if not ranks:
        raise SelectionError(f"--ranks {text!r} selects no rank; write e.g. --ranks 0,2-3")
    return sorted(set(ranks))


def parse_where(clauses: list[str]) -> dict[str, int | slice | list[int]]:
    """``["procs=0:2"]`` -> ``{"procs": slice(0, 2)}``; ``procs=1,3`` gives a list."""
    selection: dict[str, int | slice | list[int]] = {}
    for clause in clauses:
        dim, eq, value = clause.partition("=")
        if not eq or not dim.strip() or not value.strip():
            raise SelectionError(f"--where {clause!r}: write DIM=INDEX, e.g. --where procs=0")
        try:
            if ":" in value:
                start, _, stop = value.partition(":")
                selection[dim.strip()] = slice(
                    int(start) if start else None, int(stop) if stop else None
                )
            elif "," in value:
                selection[dim.strip()] = [int(v) for v in value.split(",") if v]
            else:
                selection[dim.strip()] = int(value)
        except ValueError:
            raise SelectionError(
                f"--where {clause!r}: {value!r} is not an index, a list 0,2 or a range 0:2"
            ) from None
    return selection


def select(procs: ProcMesh, ranks: str | list[int] | None = None, where=None) -> ProcMesh:
    """The view of ``procs`` that ``ranks`` (text or list) or ``where`` picks."""
    if ranks is not None and where:
        raise SelectionError("give --ranks or --where, not both")
    if where:
        clauses = [where] if isinstance(where, str) else list(where)
        selection = parse_where(clauses) if isinstance(clauses[0], str) else dict(where)
        unknown = [d for d in selection if d not in procs.shape.labels]
        if unknown:
            raise SelectionError(
                f"--where: mesh {procs.name!r} has no dimension {unknown[0]!r}; "
                f"its dimensions are {list(procs.shape.labels)!r}"
            )
        try:
            return procs.slice(**selection)
        except (MeshUsageError, IndexError) as exc:
            raise SelectionError(f"--where {clauses!r}: {exc}") from None
    if ranks is None:
        return procs
    bound = max(procs.shape.ranks) + 1
    if isinstance(ranks, str):
        wanted = parse_ranks(ranks, bound, f"mesh {procs.name!r}")
    else:
        wanted = sorted(set(ranks))
    have = set(procs.shape.ranks)
    missing = [r for r in wanted if r not in have]
    if missing:
        raise SelectionError(
            f"--ranks {format_ranks(wanted)}: mesh {procs.name!r} has ranks "
            f"{format_ranks(have)}, not {format_ranks(missing)}"
        )
    if len(procs.shape.labels) != 1 or procs.shape.ranks != tuple(range(len(procs.shape))):
        raise SelectionError(
            f"--ranks needs a one-dimensional mesh; mesh {procs.name!r} has dimensions "
            f"{list(procs.shape.labels)!r}: use --where DIM=INDEX"
        )
    return procs.slice(**{procs.shape.labels[0]: wanted})
