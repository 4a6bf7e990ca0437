"""Text (and a little HTML) for what the notebook shows: folded values, status, labels.

Pure functions over plain data, so they are tested without a kernel and the
terminal, Jupyter and nbval all see the same text.
"""

from __future__ import annotations

import html
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._controller._status import MeshStatus, RankStatus
from .._model._fold import fold_lines, format_ranks, value_text
from .._model._value_mesh import ValueMesh
from .._services._logs import LogLine


def fold_values(values: ValueMesh[Any]) -> str:
    """``[0-3] tensor([6., 6.])`` when equal; otherwise one line per group of ranks."""
    texts = (value_text(value) for value in values.values())
    return "\n".join(fold_lines(zip(values.shape.ranks, texts, strict=True)))


def all_none(values: ValueMesh[Any]) -> bool:
    return all(v is None for v in values.values())


# ANSI colours for rank prefixes, in turn (no red: that reads as an error). Jupyter
# draws them with its theme's own ANSI palette, so they stay readable in dark themes.
_RANK_COLOURS = (36, 35, 34, 32, 33, 96, 95, 94, 92, 93)


def rank_prefix(rank: int, text: str, *, colour: bool = False) -> str:
    """``[1] epoch 3``; a progress line keeps only what a terminal would show last.
    ``colour``: the prefix in the rank's colour, so interleaved live lines part by eye."""
    if "\r" in text:
        segments = [s for s in text.split("\r") if s.strip()]
        text = segments[-1] if segments else ""
    if colour:
        code = _RANK_COLOURS[rank % len(_RANK_COLOURS)]
        return f"\x1b[{code}m[{rank}]\x1b[0m {text}\n"
    return f"[{rank}] {text}\n"


def label_bundle(rank: int, data: dict[str, Any], metadata: dict[str, Any]) -> tuple[dict, dict]:
    """Tag a rank's display bundle with its rank, visibly and in metadata."""
    data = dict(data)
    if "text/plain" in data:
        data["text/plain"] = f"[{rank}] {data['text/plain']}"
    else:
        data["text/plain"] = f"[{rank}] <display>"
    if "text/html" not in data:  # an image alone would not say whose it is
        for mime in ("image/png", "image/jpeg"):
            if isinstance(data.get(mime), str):
                data["text/html"] = f'<img src="data:{mime};base64,{data[mime]}">'
                break
    if "text/html" in data:
        data["text/html"] = (
            f'<div class="monarch-nb-rank"><small>[rank {rank}]</small></div>{data["text/html"]}'
        )
    metadata = dict(metadata)
    metadata["monarch_nb"] = {"rank": rank}
    return data, metadata


def cell_label(filename: str) -> str:
    """``<mesh-cell-3>`` (or the call label ``cell <mesh-cell-3>``) -> ``%%mesh cell [3]``:
    how a notebook names a cell's work."""
    filename = filename.removeprefix("cell ")
    if filename.startswith("<mesh-cell-") and filename.endswith(">"):
        return f"%%mesh cell [{filename[len('<mesh-cell-') : -1]}]"
    return filename


def work_text(rank: RankStatus) -> str:
    """What a rank does, for a table cell: ``%%mesh cell [3] (1.2 s)``, or ``-``."""
    if rank.work:
        work = rank.work.removeprefix("cell ")
        return f"{cell_label(work)} ({rank.work_seconds:.1f} s)"
    return "call" if rank.state.value == "busy" else "-"


def megabytes(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.0f} MiB"


@dataclass(frozen=True)
class NotebookMeshStatus:
    """What ``%mesh status`` shows for one mesh: the core snapshot plus notebook facts."""

    status: MeshStatus
    dist: str | None
    default: bool

    @property
    def name(self) -> str:
        return self.status.name

    @property
    def ranks(self) -> tuple[RankStatus, ...]:
        return self.status.ranks

    def headline(self) -> str:
        s = self.status
        n = len(s.ranks)
        parts = [f"mesh {s.name!r}", str(s.state), f"{n} rank{'' if n == 1 else 's'}"]
        if self.dist:
            parts.append(f"torch.distributed: {self.dist}")
        if self.default:
            parts.append("default")
        return " · ".join(parts)

    def __repr__(self) -> str:
        return render_status([self])

    def _repr_html_(self) -> str:
        return render_status_html([self])


class Notice:
    """A one-line status message a magic shows (displayed, not printed)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


class LogView:
    """What ``%mesh logs`` shows: one ``[rank] time text`` line per log line."""

    def __init__(self, lines: list[LogLine]) -> None:
        self.lines = lines

    def __repr__(self) -> str:
        if not self.lines:
            return "no log lines matched"
        return "\n".join(str(line) for line in self.lines)


_COLUMNS = ("rank", "host", "pid", "state", "current work", "cpu", "rss")


def _rows(status: NotebookMeshStatus) -> list[tuple[str, ...]]:
    return [
        (
            str(r.rank),
            r.host,
            str(r.pid),
            str(r.state),
            work_text(r),
            "-" if r.cpu_percent is None else f"{r.cpu_percent:.0f}%",
            megabytes(r.rss_bytes),
        )
        for r in status.status.ranks
    ]


def render_status(statuses: Sequence[NotebookMeshStatus]) -> str:
    """A fixed-width text table per mesh."""
    if not statuses:
        return "no mesh is running; start one with %mesh start --procs 4"
    blocks = []
    for status in statuses:
        rows = [_COLUMNS, *_rows(status)]
        widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
        lines = [status.headline()]
        if status.status.failure:
            lines.append(f"failure: {status.status.failure}")
        for row in rows:
            cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
            lines.append("  ".join(cells).rstrip())
        lines += restart_lines(status.status)
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def render_status_html(statuses: Sequence[NotebookMeshStatus]) -> str:
    if not statuses:
        return "<p>no mesh is running; start one with <code>%mesh start --procs 4</code></p>"
    out = []
    for status in statuses:
        out.append(f"<p><b>{html.escape(status.headline())}</b></p>")
        if status.status.failure:
            out.append(f"<pre>{html.escape(status.status.failure)}</pre>")
        head = "".join(f"<th>{c}</th>" for c in _COLUMNS)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
            for row in _rows(status)
        )
        out.append(f"<table><tr>{head}</tr>{body}</table>")
        restarts = restart_lines(status.status)
        if restarts:
            out.append(f"<pre>{html.escape(chr(10).join(restarts))}</pre>")
    return "".join(out)


def restart_lines(status: MeshStatus) -> list[str]:
    """One line per restart the mesh made (``%mesh status``), oldest first."""
    lines = []
    for r in status.restarts:
        when = time.strftime("%H:%M:%S", time.localtime(r.at))
        how = "automatic" if r.automatic else "by hand"
        ranks = format_ranks(r.ranks)
        line = f"restart {when} ({how}) of ranks {ranks} in {r.seconds:.2f} s: {r.cause}"
        if r.respawned:
            line += f"; actors spawned again: {', '.join(r.respawned)}"
        if r.to_spawn_again:
            line += f"; spawn again: {', '.join(r.to_spawn_again)}"
        lines.append(line)
    return lines


class StatusView:
    """What ``%mesh status`` displays: the text table, and an HTML one in Jupyter."""

    def __init__(self, statuses: Sequence[NotebookMeshStatus]) -> None:
        self.statuses = tuple(statuses)

    def __repr__(self) -> str:
        return render_status(self.statuses)

    def _repr_html_(self) -> str:
        return render_status_html(self.statuses)
