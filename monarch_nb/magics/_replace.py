"""Ranks the runtime killed after an interrupt's grace, replaced at once (see ``_stop``).

Its own module: the mesh (``_registry``) replaces the ranks of a blocking cell,
and the stop of a ``--no-block`` cell (``_stop``) those of a cell in flight.
"""

from __future__ import annotations

from typing import Any

from .._model._errors import StuckRanksKilled, format_ranks


def replace_stuck(mesh: Any, error: StuckRanksKilled) -> StuckRanksKilled:
    """Fresh processes for the ranks ``error`` names (killed by monarch_nb after the
    grace); the error to show, saying which ranks, why, and what they lost."""
    ranks = sorted(error.ranks)
    others = [r for r in mesh.procs.shape.ranks if r not in ranks]
    label = f"rank(s) {format_ranks(ranks)}"
    try:
        mesh.restart(ranks)
    except Exception as exc:  # say so; the user can still restart by hand
        after = (
            f"replacing them failed ({type(exc).__name__}: {exc}): run %mesh restart "
            f"--ranks {format_ranks(ranks)}, or %mesh restart for every rank"
        )
    else:
        kept = f"; rank(s) {format_ranks(others)} keep their state" if others else ""
        dist = "; torch.distributed was set up again on every rank" if mesh.dist else ""
        after = (
            f"monarch_nb replaced {label} with fresh processes: their namespaces are empty "
            f"(%mesh restart --replay rebuilds every rank from %mesh history){kept}{dist}"
        )
    return StuckRanksKilled(
        f"{error.stuck}; {after}{error.where}",
        ranks=ranks,
        cause=error.cause,
        mesh=mesh.name,
        stuck=error.stuck,
        where=error.where,
    )
