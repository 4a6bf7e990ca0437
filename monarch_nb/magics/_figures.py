"""Figures from ranks in rank order, or side by side in a grid (``%%mesh --figures``).

A figure a rank displays arrives when that rank gets to it: four ranks'
plots come in the order they finished, not 0, 1, 2, 3. ``--figures rank``
holds them back until the cell ends and shows them by rank; ``--figures
grid`` shows them as one grid, each captioned with its rank (what reads
best for "the same plot on every rank"). Text still streams live.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from .._model._errors import format_ranks

FIGURE_MODES = ("arrival", "rank", "grid")
_IMAGES = ("image/png", "image/jpeg")


def _cell_html(rank: int, data: dict[str, Any]) -> str:
    if "image/svg+xml" in data:
        body = str(data["image/svg+xml"])
    else:
        for mime in _IMAGES:
            if isinstance(data.get(mime), str):
                body = f'<img src="data:{mime};base64,{data[mime]}" style="max-width:100%">'
                break
        else:
            if "text/html" in data:
                body = str(data["text/html"])
            else:
                body = f"<pre>{html.escape(str(data.get('text/plain', '')))}</pre>"
    return (
        f'<figure class="monarch-nb-figure" data-rank="{rank}" style="margin:0;min-width:0">'
        f"<figcaption><small>rank {rank}</small></figcaption>{body}</figure>"
    )


def grid_bundle(
    items: Sequence[tuple[int, dict[str, Any], dict[str, Any]]],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One display of ``items`` ((rank, data, metadata), any order) in rank order,
    as a grid that wraps to the output's width."""
    ordered = sorted(items, key=lambda item: item[0])
    ranks = [rank for rank, _, _ in ordered]
    cells = "".join(_cell_html(rank, data) for rank, data, _ in ordered)
    grid = (
        '<div class="monarch-nb-figures" style="display:grid;gap:8px;'
        'grid-template-columns:repeat(auto-fill,minmax(240px,1fr))">'
        f"{cells}</div>"
    )
    plain = [f"{len(ordered)} figures of ranks {format_ranks(sorted(set(ranks)))}:"]
    plain += [f"[{rank}] {data.get('text/plain', '<display>')}" for rank, data, _ in ordered]
    metadata = {"monarch_nb": {"ranks": ranks, "layout": "grid"}}
    return {"text/html": grid, "text/plain": "\n".join(plain)}, metadata
