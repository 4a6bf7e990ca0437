"""One tile per rank, laid out by the mesh's shape (hosts x procs).

Tiles are grouped into rows (the procs of one host, wrapped past
``MAX_COLUMNS``), one HTML widget per row: a redraw sends one comm message per
row that changed, not one per rank, so 256 ranks cost 16 messages at most.
"""

from __future__ import annotations

from collections.abc import Mapping

import ipywidgets as w

from .._controller._status import RankStatus
from .._controller._timeline import Straggler
from .._model._shape import Shape
from ._model import Progress
from ._text import tile_html

COMPACT_ABOVE = 32  # ranks: past this, tiles drop host, pid and heartbeat lines
MAX_COLUMNS = 8
MAX_COLUMNS_COMPACT = 16


def columns_for(shape: Shape) -> int:
    """The last dimension is a row (the procs of one host), wrapped when too wide."""
    sizes = list(shape.sizes) or [1]
    limit = MAX_COLUMNS_COMPACT if len(shape) > COMPACT_ABOVE else MAX_COLUMNS
    return max(1, min(sizes[-1], limit))


class TileGrid:
    """Rows of HTML tiles; :meth:`update` sends only the rows whose tiles changed."""

    def __init__(self, shape: Shape, *, heartbeat_s: float = 1.0) -> None:
        self.compact = len(shape) > COMPACT_ABOVE
        self.heartbeat_s = heartbeat_s
        columns = columns_for(shape)
        ranks = list(shape.ranks)
        per_host = list(shape.sizes)[-1] if shape.sizes else len(ranks)
        # A row never spans two hosts: split each host's procs into rows of `columns`.
        self.rows: list[tuple[int, ...]] = []
        for start in range(0, len(ranks), per_host):
            host = ranks[start : start + per_host]
            self.rows += [tuple(host[i : i + columns]) for i in range(0, len(host), columns)]
        self._row_of = {rank: i for i, row in enumerate(self.rows) for rank in row}
        self._tiles: dict[int, str] = {}
        width = "96px" if self.compact else "150px"
        self._style = (
            f"display:grid;grid-template-columns:repeat({columns}, minmax({width}, 1fr));"
            "gap:4px;margin-bottom:4px"
        )
        self.row_widgets = [w.HTML() for _ in self.rows]
        self.widget = w.VBox(self.row_widgets)
        self.widget.add_class("mnb-tiles")
        self.sent = 0  # row updates sent, for the benchmark

    def tile(self, rank: int) -> str:
        """The HTML of ``rank``'s tile as last drawn."""
        return self._tiles.get(rank, "")

    def update(
        self,
        ranks: tuple[RankStatus, ...],
        progress: Mapping[int, Progress],
        stragglers: Mapping[int, Straggler] | None = None,
        sparks: Mapping[int, str] | None = None,
    ) -> None:
        """Redraw the tiles of ``ranks``; ``sparks``: each rank's sparkline row."""
        changed: set[int] = set()
        stragglers = stragglers or {}
        sparks = sparks or {}
        for status in ranks:
            row = self._row_of.get(status.rank)
            if row is None:
                continue
            html = tile_html(
                status,
                progress.get(status.rank),
                heartbeat_s=self.heartbeat_s,
                compact=self.compact,
                straggler=stragglers.get(status.rank),
                spark=sparks.get(status.rank, ""),
            )
            if self._tiles.get(status.rank) != html:
                self._tiles[status.rank] = html
                changed.add(row)
        for row in sorted(changed):
            tiles = "".join(self._tiles.get(rank, "") for rank in self.rows[row])
            html = f'<div class="mnb-row" style="{self._style}">{tiles}</div>'
            self.row_widgets[row].value = html
            self.sent += 1

    def close(self) -> None:
        for row in self.row_widgets:
            row.close()
        self.widget.close()
