"""The dashboard: header, tiles and failure panel, redrawn by its own thread.

The mesh's observer (on the controller's I/O thread) only records and sets a
flag (:class:`~._model.DashboardFeed`); a daemon thread per dashboard takes a
status snapshot when something changed, at most every ``MIN_INTERVAL_S``
(urgent changes) or every ``REFRESH_S`` (heartbeats), and applies it to the
widgets. ipykernel sends comm messages from any thread, so the dashboard
moves while a cell keeps the kernel's main thread busy.
"""

from __future__ import annotations

import html
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from .._controller import _interrupt
from .._controller._events import (
    CallFinished,
    CallStarted,
    Heartbeat,
    MeshFailed,
    Output,
    RankFailed,
    RankStateChanged,
)
from .._controller._status import MeshState
from .._controller._timeline import Straggler
from .._model._shape import Shape
from ._chart import CHART_POINTS, MetricChart, chart_ranks, load_library
from ._hang import HangWatch
from ._model import DashboardFeed, FailureLog, FailureRecord, Progress, Throttle
from ._rank_actions import RankActions, rank_action
from ._render import NotebookMeshStatus, render_status_html
from ._sparks import SPARK_POINTS, SPARK_POINTS_COMPACT, spark_html
from ._text import as_notebook_status, failures_html, render_text
from ._theme import style_sheet

MIN_INTERVAL_S = 0.1  # at most ~10 redraws a second
REFRESH_S = 1.0  # heartbeat ages and resources, even when no event is urgent
STRAGGLERS_EVERY_S = 1.0  # the timeline is read this often, not on every redraw
STRAGGLER_MINUTES = 5.0  # how far back the calls that mark a straggler may lie
HISTORY_EVERY_S = 1.0  # sparklines and the chart: new points come once a heartbeat
DEFAULT_METRIC = "cpu_percent"
_WATCHED = (RankStateChanged, RankFailed, MeshFailed, CallStarted, CallFinished, Output, Heartbeat)


def _heartbeat_s() -> float:
    return float(os.environ.get("MONARCH_NB_HEARTBEAT", "1.0"))


class TextDashboard:
    """The dashboard where no widget front end exists: its text summary, as of display."""

    def __init__(self, mesh: Any) -> None:
        self.mesh = mesh

    def text(self) -> str:
        log: FailureLog | None = getattr(self.mesh, "failures", None)
        return render_text(self.mesh.status(), log.records() if log else ())

    def __repr__(self) -> str:
        return self.text()

    finished = True

    def finish(self) -> None:
        pass

    def close(self) -> None:
        pass


class Dashboard:
    """A live view of one mesh: a tile per rank, failures, and a rank's last output.

    ``mesh`` is a notebook mesh (``.procs``, ``.status()``, ``.failures``).
    Display it (the last expression of a cell, or ``display(d)``); it shows
    as text where widgets cannot render. It stops updating when the mesh
    stops, or on :meth:`close`.
    """

    def __init__(self, mesh: Any) -> None:
        import ipywidgets as w

        from ._failures import TAIL_LINES, FailurePanel
        from ._tiles import TileGrid

        self.mesh = mesh
        procs = mesh.procs
        self.feed = DashboardFeed()
        self.throttle = Throttle(MIN_INTERVAL_S, REFRESH_S)
        self.header = w.HTML()
        self.style = w.HTML(style_sheet())  # the dark theme's colours
        self.style.add_class("mnb-style")
        self.shape = procs.shape  # a resized mesh (mesh.procs replaced) redraws its tiles
        self.grid = TileGrid(procs.shape, heartbeat_s=_heartbeat_s())
        self.failures = FailurePanel(
            procs.shape.ranks,
            lambda rank: [o.line for o in self.mesh.procs.output_tail(rank)],
            clear=self._clear_failures,
            search=lambda rank, grep: [
                str(line) for line in procs.logs(ranks=[rank], grep=grep, tail=TAIL_LINES)
            ],
        )
        self.dismissed: dict[int, int] = {}  # rank -> the call of the slow mark hidden
        self.actions = RankActions(
            procs.shape.ranks,
            lambda action, rank: rank_action(self.mesh, action, rank),
            self.dismiss,
        )
        # The metric the tiles' sparklines and the chart show; options grow as
        # ranks log metrics of their own.
        self.metric = DEFAULT_METRIC
        self.metric_picker = w.Dropdown(
            options=[DEFAULT_METRIC, "rss_bytes"],
            value=DEFAULT_METRIC,
            description="metric",
            layout=w.Layout(width="auto"),
        )
        self.metric_picker.observe(self._pick_metric, names="value")
        self.chart: MetricChart | None = None
        self.chart_box = w.VBox()  # the chart arrives with the first history refresh
        self.sparks: dict[int, str] = {}
        self._spark_keys: dict[int, tuple[Any, str]] = {}
        self._history_at = time.monotonic()  # the first refresh after a heartbeat
        load_library()  # bqplot's import starts now, off the dashboard's thread
        self.history = w.VBox([self.metric_picker, self.chart_box])
        self.history.add_class("mnb-history")
        self.widget = w.VBox(self._sections())
        self.widget.add_class("mnb-dashboard")
        self.draws = 0
        self.status: NotebookMeshStatus | None = None
        self.progress: dict[int, Progress] = {}
        self.failure_records: tuple[FailureRecord, ...] = ()
        self.stragglers: dict[int, Straggler] = {}
        self.hang = HangWatch()  # the tile of a rank a collective waits for (see _hang)
        self._hang_offered: tuple[int, ...] = ()  # the ranks the actions bar was set to
        self._stragglers_at = 0.0
        self._drawn = threading.Condition()
        self._closed = threading.Event()
        self._draw()  # complete before it is displayed
        self._subscription = procs.events.subscribe(self.feed, kinds=_WATCHED)
        self._thread = threading.Thread(
            target=self._run, name=f"monarch_nb dashboard {procs.name}", daemon=True
        )
        self._thread.start()

    def _sections(self) -> list[Any]:
        return [
            self.style,
            self.header,
            self.grid.widget,
            self.actions.widget,
            self.history,
            self.failures.widget,
        ]

    # -- what it shows ------------------------------------------------------------------

    def _failure_log(self) -> tuple[FailureRecord, ...]:
        log: FailureLog | None = getattr(self.mesh, "failures", None)
        return log.records() if log is not None else ()

    def _clear_failures(self) -> None:
        log: FailureLog | None = getattr(self.mesh, "failures", None)
        if log is not None:
            log.clear()
        self.feed.wake.set()  # redraw soon: the failure list, and the header
        with self._drawn:
            self.failure_records = ()

    def text(self) -> str:
        """The text summary of what the dashboard shows now."""
        status = self.status or as_notebook_status(self.mesh.status())
        return render_text(status, self.failure_records, self.progress)

    def _headline(self, status: NotebookMeshStatus) -> str:
        counts = Counter(str(r.state) for r in status.ranks)
        states = " · ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        failure = ""
        if status.status.failure:
            failure = (
                "<br><small style='color:var(--jp-error-color1,#b71c1c)'>"
                f"{html.escape(status.status.failure)}</small>"
            )
        return (
            f'<div class="mnb-header"><b>{html.escape(status.headline())}</b> · '
            f"{html.escape(states)}{failure}</div>"
        )

    def _draw(self) -> None:
        _, _, progress = self.feed.take()
        status = as_notebook_status(self.mesh.status())
        failures = self._failure_log()
        headline = self._headline(status)
        if status.status.shape != self.shape:
            self._reshape(status.status.shape)
        with self.widget.hold_sync():
            if self.header.value != headline:
                self.header.value = headline
            self._refresh_history()
            # A hang mark is one more row of the tile, after the sparkline.
            marks = self.hang.update(self.mesh.procs, status.ranks)
            self._offer_why(marks)
            rows = {r: self.sparks.get(r, "") + marks.get(r, "") for r in {*self.sparks, *marks}}
            self.grid.update(status.ranks, progress, self._stragglers(), rows)
            self.failures.update(failures)
        with self._drawn:
            self.status, self.progress, self.failure_records = status, progress, failures
            self.draws += 1
            self.throttle.drew(time.monotonic())
            self._drawn.notify_all()

    def _offer_why(self, marks: dict[int, str]) -> None:
        """A hang newly found: the actions bar picks the first rank it names and shows
        what its "why" would (the diagnosis the marks come from, every rank's place),
        before anyone presses stop. Its buttons cannot answer while a cell holds the
        kernel, as a hang's cell does. Once per hang, so a rank the user picks
        afterwards stays picked."""
        ranks = tuple(sorted(marks))
        if ranks and ranks != self._hang_offered:
            note = (
                "a hang: %mesh why, read now (stop interrupts the ranks, then kills and "
                f"replaces those still waiting {_interrupt.GRACE_S:g} s later)"
            )
            self.actions.offer(ranks[0], note, self.hang.report)
        self._hang_offered = ranks

    def _stragglers(self) -> dict[int, Straggler]:
        """Ranks much slower than the others on one of the last few calls, from the
        call timeline; recomputed at most every STRAGGLERS_EVERY_S."""
        now = time.monotonic()
        if now - self._stragglers_at >= STRAGGLERS_EVERY_S:
            self._stragglers_at = now
            try:
                timeline = self.mesh.procs.timeline(minutes=STRAGGLER_MINUTES)
                self.stragglers = timeline.latest_stragglers(dismissed=self.dismissed)
            except Exception:  # a stopped or replaced mesh: nothing to mark
                self.stragglers = {}
        return self.stragglers

    def dismiss(self, rank: int) -> str:
        """Hide ``rank``'s straggler mark (until it straggles on a later call); what
        the dashboard says about it."""
        mark = self.stragglers.get(rank)
        if mark is None:
            return f"rank {rank} has no slow mark"
        self.dismissed[rank] = mark.call_id
        self._stragglers_at = 0.0  # redraw without it now
        self.feed.wake.set()
        return f"rank {rank}'s slow mark (call {mark.call_id}) dismissed"

    def _pick_metric(self, change: dict[str, Any]) -> None:
        self.metric = change["new"]
        self._history_at = 0.0  # redraw sparklines and chart with the next draw
        self.feed.wake.set()

    def _refresh_history(self) -> None:
        """Sparklines of every rank and the chart, from the telemetry kept on the
        controller: at most every HISTORY_EVERY_S, on the dashboard's thread."""
        now = time.monotonic()
        if now - self._history_at < HISTORY_EVERY_S:
            return
        self._history_at = now
        procs = self.mesh.procs
        try:
            points = SPARK_POINTS_COMPACT if self.grid.compact else SPARK_POINTS
            series = procs.telemetry_series(self.metric, points)
            names = procs.telemetry_metrics()
        except Exception:  # a stopped or replaced mesh: keep what is shown
            return
        sparks = {}
        for rank, rows in series.items():
            # A rank with no new point since the last refresh keeps its line.
            key = (self.metric, len(rows), rows[-1].time if rows else 0.0)
            drawn = self._spark_keys.get(rank)
            if drawn is not None and drawn[0] == key:
                sparks[rank] = drawn[1]
            else:
                sparks[rank] = spark_html(self.metric, [row.value for row in rows])
                self._spark_keys[rank] = (key, sparks[rank])
        self.sparks = sparks
        options = list(dict.fromkeys([*self.metric_picker.options, *names]))
        if options != list(self.metric_picker.options):
            self.metric_picker.options = options
        self._draw_chart(procs, series)

    def _draw_chart(self, procs: Any, series: dict[int, list[Any]]) -> None:
        if self.chart is None:
            if self.chart_box.children:  # the note that bqplot is missing
                return
            usable = load_library()
            if usable is None:
                return  # still importing, on its own thread: the next refresh
            if not usable:
                import ipywidgets as w

                note = "pip install bqplot (or monarch_nb[notebook]) to chart a metric across ranks"
                self.chart_box.children = [w.HTML(f"<small>{note}</small>")]
                return
            self.chart = MetricChart()
            self.chart_box.children = [self.chart.widget]
        latest = {rank: rows[-1].value for rank, rows in series.items() if rows}
        ranks = chart_ranks(latest)
        self.chart.draw(self.metric, procs.telemetry_series(self.metric, CHART_POINTS, ranks=ranks))

    def _reshape(self, shape: Shape) -> None:
        """The mesh was resized: tiles for its new ranks, and a rank picker of them."""
        from ._tiles import TileGrid

        old, self.grid = self.grid, TileGrid(shape, heartbeat_s=_heartbeat_s())
        self.shape = shape
        self.failures.set_ranks(shape.ranks)
        self.actions.set_ranks(shape.ranks)
        self.sparks, self._spark_keys = {}, {}
        self._history_at = 0.0
        self.widget.children = self._sections()
        old.close()

    def _run(self) -> None:
        while not self._closed.is_set():
            urgent = self.feed.wake.is_set()
            wait = self.throttle.next_wait(time.monotonic(), urgent)
            if wait > 0:
                # Urgent: coalesce whatever else comes in the rest of the interval.
                (self._closed if urgent else self.feed.wake).wait(wait)
                continue
            try:
                self._draw()
            except Exception:  # a closed comm, a kernel going away: stop quietly
                break
            if self.status is not None and self.status.status.state is MeshState.STOPPED:
                break
        self._subscription.close()

    # -- for callers and tests ------------------------------------------------------------

    def wait_until(self, predicate: Callable[[Dashboard], bool], timeout: float = 5.0) -> bool:
        """Block until ``predicate(self)`` holds after a redraw; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._drawn:
            while not predicate(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._drawn.wait(left)
            return True

    def show_output(self, rank: int) -> None:
        """Show ``rank``'s last lines of output under the failure panel."""
        self.failures.select(rank)

    def close(self) -> None:
        """Stop updating and remove the widgets."""
        self._closed.set()
        self.feed.wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(5)
        self._subscription.close()
        self.failures.close()
        self.actions.close()
        self.style.close()
        self.grid.close()
        if self.chart is not None:
            self.chart.close()
        self.metric_picker.close()
        self.chart_box.close()
        self.history.close()
        self.header.close()
        self.widget.close()

    @property
    def finished(self) -> bool:
        return self._closed.is_set() or not self._thread.is_alive()

    def finish(self) -> None:
        """Draw once more (the mesh stopped) and stop updating; the widgets stay."""
        self._closed.set()
        self.feed.wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(5)
        try:
            self._draw()
        except Exception:
            pass  # the kernel is going away: nothing left to show it to
        self._subscription.close()

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        # The widget for front ends that render it; for the others (nbval, a
        # static HTML export) the same text and HTML table as %mesh status.
        bundle = dict(self.widget._repr_mimebundle_(**kwargs) or {})
        status = self.status or as_notebook_status(self.mesh.status())
        bundle["text/plain"] = self.text()
        table = render_status_html([status])
        if self.failure_records:
            table += failures_html(self.failure_records)
        bundle["text/html"] = table
        return bundle

    def __repr__(self) -> str:
        return self.text()


def widgets_available(shell: Any = None) -> bool:
    """Whether widgets can render: an IPython kernel (not a terminal) with ipywidgets."""
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return False
        shell = get_ipython()
    if shell is None or getattr(shell, "kernel", None) is None:
        return False
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


def show_dashboard(mesh: Any, shell: Any = None) -> Dashboard | TextDashboard:
    """A live Dashboard in a kernel with ipywidgets, else the text summary."""
    if widgets_available(shell):
        return Dashboard(mesh)
    return TextDashboard(mesh)
