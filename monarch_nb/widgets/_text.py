"""What the dashboard says, as pure functions of a snapshot: text, tile HTML, failure HTML.

The text summary is what plain IPython, nbval and the widget's ``text/plain``
fallback show; the tiles and the failure panel render the same data as HTML.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

from .._controller._events import RankState
from .._controller._status import MeshStatus, RankStatus
from ..magics._render import NotebookMeshStatus, cell_label, megabytes, render_status
from ._model import FailureRecord, Progress

# A heartbeat older than this many intervals marks the tile as stale (a hung host,
# a stopped process); ranks busy in C code still beat, their wire thread runs.
STALE_HEARTBEATS = 3.0
MAX_FAILURES_SHOWN = 20

COLOURS: dict[RankState, tuple[str, str]] = {  # background, text
    RankState.STARTING: ("#cfd8dc", "#263238"),
    RankState.IDLE: ("#c8e6c9", "#1b5e20"),
    RankState.BUSY: ("#bbdefb", "#0d47a1"),
    RankState.PAUSED: ("#ffe082", "#5d4037"),
    RankState.FAILED: ("#ef9a9a", "#7f0000"),
    RankState.DEAD: ("#c62828", "#ffffff"),
    RankState.STOPPED: ("#e0e0e0", "#616161"),
}


def as_notebook_status(status: MeshStatus | NotebookMeshStatus) -> NotebookMeshStatus:
    if isinstance(status, NotebookMeshStatus):
        return status
    return NotebookMeshStatus(status, None, False)


def describe_failure(record: FailureRecord) -> str:
    """``rank 1 · 06:30:01 · was killed by signal SIGKILL · during %%mesh cell [3]``."""
    parts = [f"rank {record.rank}", record.when(), record.cause]
    if record.label:
        parts.append(f"during {cell_label(record.label)}")
    return " · ".join(parts)


def progress_text(rank: int, progress: Progress) -> str:
    return f"[{rank}] {progress.text}"


def render_text(
    status: MeshStatus | NotebookMeshStatus,
    failures: Sequence[FailureRecord] = (),
    progress: Mapping[int, Progress] | None = None,
) -> str:
    """The dashboard as text: the status table, then progress bars and failures.

    With no failures and no progress it is exactly ``%mesh status``'s table.
    """
    lines = [render_status([as_notebook_status(status)])]
    bars = sorted((progress or {}).items())
    if bars:
        lines.append("progress:")
        lines += [f"  {progress_text(rank, p)}" for rank, p in bars]
    if failures:
        lines.append(f"failures ({len(failures)}):")
        shown = failures[-MAX_FAILURES_SHOWN:]
        if len(failures) > len(shown):
            lines.append(f"  ... {len(failures) - len(shown)} earlier failures not shown")
        lines += [f"  {describe_failure(f)}" for f in shown]
    return "\n".join(lines)


# -- tiles ---------------------------------------------------------------------------


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "no heartbeat yet"
    if seconds < 1.0:
        return "beat <1 s ago"  # the usual case: kept constant so idle tiles stay unchanged
    return f"beat {seconds:.0f} s ago"


def _work(rank: RankStatus) -> str:
    if not rank.work:
        return "busy" if rank.state is RankState.BUSY else "-"
    return f"{cell_label(rank.work.removeprefix('cell '))} · {rank.work_seconds:.0f} s"


def _gpu(rank: RankStatus) -> str:
    if rank.gpu_memory_allocated is None and rank.gpu_utilization is None:
        return ""
    parts = ["GPU"]
    if rank.gpu_memory_allocated is not None:
        parts.append(
            f"{megabytes(rank.gpu_memory_allocated)}/{megabytes(rank.gpu_memory_reserved)}"
        )
    if rank.gpu_utilization is not None:
        parts.append(f"{rank.gpu_utilization:.0f}%")
    return " ".join(parts)


def tile_html(
    rank: RankStatus,
    progress: Progress | None = None,
    *,
    heartbeat_s: float = 1.0,
    compact: bool = False,
) -> str:
    """One rank's tile. Numbers are rounded so that an idle rank's tile stays the
    same string from one refresh to the next (an unchanged tile sends nothing)."""
    background, colour = COLOURS.get(rank.state, ("#ffffff", "#000000"))
    stale = (
        rank.heartbeat_age is not None
        and rank.heartbeat_age > STALE_HEARTBEATS * heartbeat_s
        and rank.state not in (RankState.DEAD, RankState.STOPPED)
    )
    border = "2px solid #ff6f00" if stale else "1px solid rgba(0,0,0,0.15)"
    # Whole percents, rounded down: an idle rank's 0.4 % and 0.6 % both read 0 %.
    cpu = "-" if rank.cpu_percent is None else f"{int(rank.cpu_percent)}%"
    rows = [f"<b>rank {rank.rank}</b> <span>{html.escape(str(rank.state))}</span>"]
    if not compact:
        rows.append(f"{html.escape(rank.host)} · pid {rank.pid}")
    rows.append(html.escape(_work(rank)))
    rows.append(f"cpu {cpu} · rss {megabytes(rank.rss_bytes)}")
    gpu = _gpu(rank)
    if gpu:
        rows.append(html.escape(gpu))
    if progress is not None and rank.state is RankState.BUSY:
        if progress.fraction is not None:
            pct = f"{100 * progress.fraction:.0f}%"
            rows.append(
                '<div class="mnb-bar" style="background:rgba(0,0,0,0.12);height:6px">'
                f'<div style="width:{pct};height:6px;background:{colour}"></div></div>'
            )
        if not compact:
            title, shown = html.escape(progress.text), html.escape(progress.text[:40])
            rows.append(f'<span title="{title}">{shown}</span>')
    if rank.failure and rank.state in (RankState.FAILED, RankState.DEAD):
        rows.append(f"<i>{html.escape(rank.failure[:80])}</i>")
    alive = rank.state not in (RankState.DEAD, RankState.STOPPED)
    if not compact and alive:
        rows.append(f"<small>{_age(rank.heartbeat_age)}{' · stale' if stale else ''}</small>")
    elif rank.returncode is not None:
        rows.append(f"<small>returncode {rank.returncode}</small>")
    size = "10px" if compact else "12px"
    return (
        f'<div class="mnb-tile mnb-{rank.state}" data-rank="{rank.rank}" '
        f'style="background:{background};color:{colour};border:{border};border-radius:4px;'
        f"padding:3px 5px;font-size:{size};line-height:1.3;"
        'font-family:var(--jp-code-font-family,monospace)">' + "<br>".join(rows) + "</div>"
    )


def failures_html(failures: Sequence[FailureRecord]) -> str:
    """The failure panel's list: rank, time, cause, and the traceback folded away."""
    if not failures:
        return '<div class="mnb-failures mnb-none"><small>no failures</small></div>'
    items = []
    for record in failures[-MAX_FAILURES_SHOWN:]:
        exit_code = f" (returncode {record.returncode})" if record.returncode is not None else ""
        item = (
            f'<div class="mnb-failure" data-rank="{record.rank}" style="color:#b71c1c">'
            f"<b>rank {record.rank}</b> · {record.when()} · {html.escape(record.cause)}{exit_code}"
        )
        if record.label:
            item += f" · during {html.escape(cell_label(record.label))}"
        if record.traceback:
            item += (
                "<details><summary>traceback</summary>"
                f"<pre style='font-size:11px'>{html.escape(record.traceback)}</pre></details>"
            )
        items.append(item + "</div>")
    head = f"<b>failures ({len(failures)})</b>"
    return f'<div class="mnb-failures">{head}{"".join(items)}</div>'


def output_html(rank: int, lines: Sequence[str]) -> str:
    body = html.escape("\n".join(lines)) if lines else "(no output yet)"
    return (
        f'<div class="mnb-output" data-rank="{rank}"><small>last {len(lines)} lines of rank '
        f"{rank}</small><pre style='max-height:16em;overflow:auto;font-size:11px;margin:0'>"
        f"{body}</pre></div>"
    )
