"""Folding per-rank results: equal ones are shown once, labelled by their rank set.

The one folding rule for values (``ValueMesh`` reprs, ``%%mesh`` output) and
errors (one traceback per distinct failure), with one cap on how many
distinct groups are listed before "... and N more".
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")

MAX_GROUPS_SHOWN = 8
MAX_REPR_CHARS = 2000  # one rank's value; longer reprs are cut with a marker


def format_ranks(ranks: Iterable[int]) -> str:
    """Compact rank set: ``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


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


def value_text(value: Any) -> str:
    """``repr(value)``, cut past ``MAX_REPR_CHARS``; a broken ``__repr__`` is described."""
    try:
        text = repr(value)
    except Exception as exc:  # a broken __repr__ must not hide the other ranks
        text = f"<repr failed: {type(exc).__name__}: {exc}>"
    if len(text) > MAX_REPR_CHARS:
        text = text[:MAX_REPR_CHARS] + f"... ({len(text) - MAX_REPR_CHARS} more characters)"
    return text


def fold_lines(ranked_texts: Iterable[tuple[int, str]]) -> list[str]:
    """``[0-3] tensor([6., 6.])`` when equal; otherwise one line per group of ranks.

    Groups keep the order of their first rank; a multi-line text is indented
    under its label so the rank stays visible.
    """
    groups = fold(ranked_texts)
    lines = []
    for ranks, text in groups[:MAX_GROUPS_SHOWN]:
        label = f"[{format_ranks(ranks)}] "
        first, *rest = text.splitlines() or [""]
        lines.append(label + first)
        lines.extend(" " * len(label) + line for line in rest)
    tail = more(len(groups), what="more distinct values")
    if tail:
        lines.append(tail)
    return lines
