"""Folding per-rank results: equal ones are shown once, labelled by their rank set.

The one folding rule for values (``ValueMesh`` reprs, ``%%mesh`` output) and
errors (one traceback per distinct failure), with one cap on how many
distinct groups are listed before "... and N more".
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import TypeVar

T = TypeVar("T")

MAX_GROUPS_SHOWN = 8


def fold(
    ranked: Iterable[tuple[int, T]], key: Callable[[T], Hashable] | None = None
) -> list[tuple[tuple[int, ...], T]]:
    """``[(ranks, first value), ...]`` grouping equal keys, in order of first appearance."""
    groups: dict[Hashable, tuple[list[int], T]] = {}
    for rank, value in ranked:
        k = value if key is None else key(value)
        entry = groups.get(k)
        if entry is None:
            groups[k] = ([rank], value)
        else:
            entry[0].append(rank)
    return [(tuple(ranks), value) for ranks, value in groups.values()]


def more(total: int, shown: int = MAX_GROUPS_SHOWN, what: str = "more") -> str | None:
    """``"... and 3 more"`` when ``total`` groups exceed what is shown, else None."""
    return f"... and {total - shown} {what}" if total > shown else None
