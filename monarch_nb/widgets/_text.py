"""What the dashboard says, as pure functions of a snapshot: text, tile HTML, failure HTML.

The text summary is what plain IPython, nbval and the widget's ``text/plain``
fallback show; the tiles and the failure panel render the same data as HTML.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

from .._controller._events import RankState
from .._controller._status import MeshStatus, RankStatus
from .._controller._timeline import Straggler
from .._model._errors import format_ranks
from . import _theme
from ._model import FailureGroup, FailureRecord, Progress, fold_failures
from ._render import NotebookMeshStatus, cell_label, megabytes, render_status

# A heartbeat older than this many intervals marks the tile as stale (a hung host,
# a stopped process); ranks busy in C code still beat, their wire thread runs.
STALE_HEARTBEATS = 3.0
MAX_FAILURE_GROUPS_SHOWN = 5  # newest first; older groups are counted ("... and 3 more")


def as_notebook_status(status: MeshStatus | NotebookMeshStatus) -> NotebookMeshStatus:
    if isinstance(status, NotebookMeshStatus):
        return status
    return NotebookMeshStatus(status, None, False)


def ranks_text(ranks: Sequence[int]) -> str:
    """``rank 1`` or ``ranks 0-2,5``."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"


def describe_failure(group: FailureGroup) -> str:
    """``ranks 0-3 · 06:30:01 · ValueError: boom · during %%mesh cell [3]``."""
    record = group.record
    parts = [ranks_text(group.ranks), record.when(), record.cause]
    if record.label:
        parts.append(f"during {cell_label(record.label)}")
    if group.count > len(group.ranks):
        parts.append(f"{group.count} times")
    return " · ".join(parts)


def _more_failures(groups: Sequence[FailureGroup]) -> str | None:
    hidden = len(groups) - MAX_FAILURE_GROUPS_SHOWN
    return f"... and {hidden} more (older)" if hidden > 0 else None


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
        groups = fold_failures(failures)
        lines.append(f"failures ({len(failures)}, newest first):")
        lines += [f"  {describe_failure(g)}" for g in groups[:MAX_FAILURE_GROUPS_SHOWN]]
        more = _more_failures(groups)
        if more:
            lines.append(f"  {more}")
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


# Rows a tile can hold: rank and state, host and pid, work, cpu and rss, the
# sparkline, GPU, progress or failure, heartbeat or returncode (fewer when compact). Every tile
# is this tall whatever it shows, so the grid does not jump as bars come and go.
TILE_ROWS = 8
TILE_ROWS_COMPACT = 5
_BAR_PX = 6
_ROW = "white-space:nowrap;overflow:hidden;text-overflow:ellipsis"


def tile_html(
    rank: RankStatus,
    progress: Progress | None = None,
    *,
    heartbeat_s: float = 1.0,
    compact: bool = False,
    straggler: Straggler | None = None,
    spark: str = "",
) -> str:
    """One rank's tile, of a fixed height (long rows are cut with an ellipsis);
    ``straggler``: the rank was much slower than the others on a recent call;
    ``spark``: its sparkline row (HTML, from ``_sparks.spark_html``).

    Numbers are rounded so that an idle rank's tile stays the same string from
    one refresh to the next (an unchanged tile sends nothing)."""
    background, colour = _theme.background(rank.state), _theme.foreground(rank.state)
    stale = (
        rank.heartbeat_age is not None
        and rank.heartbeat_age > STALE_HEARTBEATS * heartbeat_s
        and rank.state not in (RankState.DEAD, RankState.STOPPED)
    )
    border = "2px solid #ff6f00" if stale else "1px solid rgba(0,0,0,0.15)"
    # Whole percents, rounded down: an idle rank's 0.4 % and 0.6 % both read 0 %.
    cpu = "-" if rank.cpu_percent is None else f"{int(rank.cpu_percent)}%"
    rows = [f"<b>rank {rank.rank}</b> <span>{html.escape(str(rank.state))}</span>"]
    if straggler is not None and straggler.median > 0:
        rows.append(straggler_html(straggler))
        if not stale:
            border = f"2px dashed {_theme.STRAGGLER_BG}"
    if not compact:
        rows.append(f"{html.escape(rank.host)} · pid {rank.pid}")
    rows.append(html.escape(_work(rank)))
    rows.append(f"cpu {cpu} · rss {megabytes(rank.rss_bytes)}")
    if spark:
        rows.append(spark)
    gpu = _gpu(rank)
    if gpu:
        rows.append(html.escape(gpu))
    bar = ""
    if progress is not None and rank.state is RankState.BUSY:
        if progress.fraction is not None:
            pct = f"{100 * progress.fraction:.0f}%"
            bar = (
                f'<div class="mnb-bar" style="background:rgba(0,0,0,0.12);height:{_BAR_PX}px">'
                f'<div style="width:{pct};height:{_BAR_PX}px;background:{colour}"></div></div>'
            )
        if not compact:
            title, shown = html.escape(progress.text), html.escape(progress.text[:40])
            rows.append(f'<span title="{title}">{shown}</span>')
    if rank.failure and rank.state in (RankState.FAILED, RankState.DEAD):
        title = html.escape(rank.failure)
        rows.append(f'<i title="{title}">{html.escape(rank.failure[:80])}</i>')
    alive = rank.state not in (RankState.DEAD, RankState.STOPPED)
    if not compact and alive:
        rows.append(f"<small>{_age(rank.heartbeat_age)}{' · stale' if stale else ''}</small>")
    elif rank.returncode is not None:
        rows.append(f"<small>returncode {rank.returncode}</small>")
    size = "10px" if compact else "12px"
    lines = TILE_ROWS_COMPACT if compact else TILE_ROWS
    body = "".join(f'<div style="{_ROW}">{row}</div>' for row in rows[:1]) + bar
    body += "".join(f'<div style="{_ROW}">{row}</div>' for row in rows[1:])
    return (
        f'<div class="mnb-tile mnb-{rank.state}" data-rank="{rank.rank}" '
        f'style="background:{background};color:{colour};border:{border};border-radius:4px;'
        f"padding:3px 5px;font-size:{size};line-height:1.3;box-sizing:content-box;"
        f"height:calc({lines} * 1.3em + {_BAR_PX}px);overflow:hidden;"
        'font-family:var(--jp-code-font-family,monospace)">' + body + "</div>"
    )


def straggler_html(straggler: Straggler) -> str:
    """A tile's straggler row: ``slow 3.1x in cell [3]``, its numbers in the tooltip."""
    title = html.escape(f"{straggler} (time paused in the debugger left out)")
    where = cell_label(straggler.label).removeprefix("%%mesh ")
    return (
        f'<span class="mnb-straggler" data-call="{straggler.call_id}" title="{title}" '
        f'style="background:{_theme.STRAGGLER_BG};color:#fff;border-radius:3px;padding:0 3px">'
        f"slow {straggler.ratio:.1f}x</span> in {html.escape(where)}"
    )


def failures_html(failures: Sequence[FailureRecord]) -> str:
    """The failure panel's list: identical failures folded by rank set, newest first,
    each with its cause and its traceback folded away."""
    if not failures:
        return '<div class="mnb-failures mnb-none"><small>no failures</small></div>'
    groups = fold_failures(failures)
    items = []
    for group in groups[:MAX_FAILURE_GROUPS_SHOWN]:
        record = group.record
        exit_code = f" (returncode {record.returncode})" if record.returncode is not None else ""
        item = (
            f'<div class="mnb-failure" data-rank="{format_ranks(group.ranks)}" '
            'style="color:var(--jp-error-color1,#b71c1c)">'
            f"<b>{ranks_text(group.ranks)}</b> · {record.when()} · "
            f"{html.escape(record.cause)}{exit_code}"
        )
        if record.label:
            item += f" · during {html.escape(cell_label(record.label))}"
        if group.count > len(group.ranks):
            item += f" · {group.count} times"
        if record.traceback:
            item += (
                "<details><summary>traceback</summary>"
                f"<pre style='font-size:11px'>{html.escape(record.traceback)}</pre></details>"
            )
        items.append(item + "</div>")
    more = _more_failures(groups)
    if more:
        items.append(f'<div class="mnb-more"><small>{html.escape(more)}</small></div>')
    head = f"<b>failures ({len(failures)}, newest first)</b>"
    return (
        f'<div class="mnb-failures" style="max-height:16em;overflow:auto">{head}'
        f"{''.join(items)}</div>"
    )


def output_html(rank: int, lines: Sequence[str]) -> str:
    body = html.escape("\n".join(lines)) if lines else "(no output yet)"
    return (
        f'<div class="mnb-output" data-rank="{rank}"><small>last {len(lines)} lines of rank '
        f"{rank}</small><pre style='max-height:16em;overflow:auto;font-size:11px;margin:0'>"
        f"{body}</pre></div>"
    )


def search_html(rank: int, pattern: str, lines: Sequence[str], error: str = "") -> str:
    """The dashboard's search result: ``rank``'s log lines matching ``pattern``."""
    if error:
        body = html.escape(error)
    else:
        body = html.escape("\n".join(lines)) if lines else "(no line matched)"
    return (
        f'<div class="mnb-output mnb-search" data-rank="{rank}"><small>last {len(lines)} '
        f"lines of rank {rank}'s log matching {html.escape(repr(pattern))}</small>"
        f"<pre style='max-height:16em;overflow:auto;font-size:11px;margin:0'>{body}</pre></div>"
    )
