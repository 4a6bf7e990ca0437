"""What a process mesh tells about its ranks: status, stacks, profiles, why it
hangs, a timeline of its calls, telemetry, and what the ranks wrote.

:class:`MeshObservation` is a base of :class:`~._proc_mesh.ProcMesh`; each
method reads the mesh's process group for the ranks of the view it is called
on, and none of them sends user code to a rank.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal, overload

from .._model import _checks
from .._model._errors import MeshUsageError
from .._model._fold import format_ranks
from .._model._future import Future, completed
from .._services import _logs
from .._wire._messages import ReadLogs
from . import _diagnose, _stacks, _telemetry
from ._log_stream import check_option

if TYPE_CHECKING:
    from .._model._shape import Shape
    from ._diagnose import Diagnosis
    from ._events import Output
    from ._process_group import ProcGroup
    from ._stacks import Profile, Stacks
    from ._status import MeshStatus
    from ._telemetry import TelemetrySample
    from ._timeline import Timeline

LOG_READ_TIMEOUT_S = 60.0  # for the hosts of a multi-host mesh to send their log lines


class MeshObservation:
    """The observing half of a process mesh: a base of ProcMesh, over its group and view."""

    __slots__ = ()

    _group: ProcGroup
    _shape: Shape
    run: Callable[..., Any]  # ProcMesh's: runs source on every rank of this view

    def status(self) -> MeshStatus:
        """A snapshot of this view's ranks: state, current work, resources, heartbeats.
        A mesh that was resized answers for the whole mesh it was resized into."""
        group = self._group
        while group.successor is not None:
            group = group.successor
        if group is not self._group:
            return group.status(group.shape.ranks)
        return group.status(self._shape.ranks)

    def stacks(self, timeout: float = 5.0, *, native: bool = False) -> Stacks:
        """Each rank's stack, as a dict ``{rank: text}`` whose ``str()`` (and notebook
        display) shows identical stacks once, labelled with their ranks.

        By default the main thread's Python stack, answered by each rank's wire
        thread even while it is busy (and on a failed mesh's survivors). A rank
        that does not answer within ``timeout`` s (dead, stopped, or its Python
        held by C code) is listed with why there is no stack.

        ``native=True`` reads every thread's Python and native (C/C++) frames
        from outside with py-spy (``pip install py-spy``), so a rank spinning in C
        shows where; on a multi-host mesh each host's agent runs it. Raises
        :class:`~monarch_nb.ProfilerUnavailable` saying what to do if py-spy is
        missing (here or on a rank's host) or the OS refuses it (ptrace).
        """
        timeout = _checks.bounded_timeout(timeout, "stacks")
        ranks = self._shape.ranks
        if native:
            return _stacks.native_stacks(self._group, ranks, max(timeout, 1.0))
        return _stacks.python_stacks(self._group, ranks, timeout)

    def profile(
        self,
        seconds: float = 5.0,
        *,
        format: str = "flamegraph",
        native: bool = False,
        rate: int = 100,
    ) -> Profile:
        """Sample every rank with py-spy for ``seconds`` (at once) and return a flame
        graph per rank: shown in the cell in a notebook, ``.save(dir)`` anywhere.

        ``format="speedscope"`` records speedscope JSON instead of SVG;
        ``native=True`` adds C/C++ frames; ``rate`` is samples per second. Raises
        :class:`~monarch_nb.ProfilerUnavailable` as :meth:`stacks` does.
        """
        return _stacks.profile(
            self._group, self._shape.ranks, seconds, format=format, native=native, rate=rate
        )

    def diagnose(self, timeout: float = 5.0) -> Diagnosis:
        """Why is it hanging? Which ranks wait in which torch.distributed collective,
        and where the ranks that have not entered it are instead (``%mesh why``).

        ``str()`` of the result reads as ``ranks 0,2-3 waiting in all_reduce #41,
        called from `dist.all_reduce(g)` at train.py:40 ...; rank 1 not in it:
        in `loss.backward()` at train.py:88 ...``; ``.missing()`` and
        ``.collectives()`` are the data. Ranks stuck in C holding the GIL are
        read with py-spy where it is installed.
        """
        timeout = _checks.bounded_timeout(timeout, "diagnose")
        return _diagnose.diagnose(self._group, self._shape.ranks, timeout)

    def timeline(self, minutes: float = 10.0) -> Timeline:
        """Who ran which call or cell when, per rank, over the last ``minutes``
        (``%mesh timeline``): a chart in a notebook, a text chart when printed.

        ``.spans`` has one Span per rank and call (label, start, end, outcome:
        ok, error, interrupted, died, cancelled or running); ``.stragglers()``
        the ranks that took more than 1.5x the median rank of the same call.
        The newest 5,000 calls are kept (at most 50,000 rank-calls); a resized
        mesh starts a new timeline.
        """
        if minutes <= 0:
            raise ValueError(f"timeline(minutes={minutes!r}): give a positive number of minutes")
        return self._group.timeline.timeline(self._shape.ranks, time.time() - 60.0 * minutes)

    @overload
    def telemetry(
        self,
        minutes: float = ...,
        *,
        metrics: Iterable[str] | None = ...,
        records: Literal[False] = ...,
    ) -> Any: ...
    @overload
    def telemetry(
        self, minutes: float = ..., *, metrics: Iterable[str] | None = ..., records: Literal[True]
    ) -> list[TelemetrySample]: ...
    def telemetry(
        self, minutes: float = 10.0, *, metrics: Iterable[str] | None = None, records: bool = False
    ) -> Any:
        """Each rank's resources and reported metrics over the last ``minutes``, a row
        per value: a pandas DataFrame with columns time (UTC), rank, metric, value,
        step (``records=True``: a list of TelemetrySample, no pandas needed).

        Resources come with every heartbeat (each second): ``cpu_percent``,
        ``rss_bytes``, and ``gpu_memory_allocated`` / ``gpu_utilization`` on ranks
        that use a GPU. A rank adds its own with ``monarch_nb.log_metric("loss",
        v, step=i)``; they arrive with its next heartbeat. ``metrics`` keeps only
        those names. The window is ``MONARCH_NB_TELEMETRY_MINUTES`` (10) at most;
        rows stay across ``restart()`` and after a rank died, and a resized mesh
        starts afresh.
        """
        if minutes <= 0:
            raise ValueError(f"telemetry(minutes={minutes!r}): give a positive number of minutes")
        if isinstance(metrics, str):
            metrics = [metrics]
        rows = self._group.telemetry.samples(
            self._shape.ranks, time.time() - 60.0 * minutes, metrics
        )
        return rows if records else _telemetry.as_dataframe(rows)

    def telemetry_series(
        self, metric: str, points: int = 24, *, ranks: Iterable[int] | None = None
    ) -> dict[int, list[TelemetrySample]]:
        """The last ``points`` values of ``metric`` of each rank (of ``ranks``, mesh
        ranks, if given), oldest first.

        Cheap enough to poll every second on hundreds of ranks (it reads each
        rank's newest rows only): what the dashboard's sparklines and chart draw.
        """
        if points <= 0:
            raise ValueError(f"telemetry_series(points={points!r}): give a positive count")
        history = self._group.telemetry
        wanted = self._shape.ranks if ranks is None else list(ranks)
        unknown = sorted(set(wanted) - set(self._shape.ranks))
        if unknown:
            raise ValueError(
                f"telemetry_series(ranks=...): {unknown} not in this mesh "
                f"(its ranks: {format_ranks(self._shape.ranks)})"
            )
        return {rank: history.recent(rank, metric, points) for rank in wanted}

    def telemetry_metrics(self) -> list[str]:
        """The metric names some rank has reported: resources first, then the ones
        ranks logged with ``monarch_nb.log_metric``."""
        return self._group.telemetry.metric_names()

    def output_tail(self, rank: int) -> list[Output]:
        """The last lines ``rank`` wrote, oldest first (a bounded buffer per rank)."""
        self._shape.index_of_rank(rank)  # raises for a rank outside this view
        return self._group.output_tail(rank)

    def logs(
        self,
        ranks: Iterable[int] | None = None,
        *,
        grep: str | None = None,
        since: float | str | dt.datetime | dt.timedelta | None = None,
        level: int | str | None = None,
        tail: int | None = None,
        runs: str = "this",
    ) -> list[_logs.LogLine]:
        """What ranks wrote to their log files, oldest first: every line they printed
        and every ``logging`` record they made, with its level, kept across
        :meth:`restart` and after a rank died.

        ``ranks`` (default: this view's), ``grep`` (a regular expression),
        ``since`` (seconds ago, ``"5m"``, ``"2h"``, a datetime), ``level``
        (``"WARNING"``: records at that level or above) and ``tail`` (the last
        N matches) narrow it down. Meshes of the same name (every unnamed mesh is
        ``procs``) write to the same files: ``runs="this"`` (the default) reads
        the lines written since this mesh started (its restarts included),
        ``runs="all"`` those of earlier runs too. Each :class:`~monarch_nb.LogLine` prints as
        ``[rank] time text``. Files live in ``MONARCH_NB_LOG_DIR/<mesh name>/``
        (default ``~/.monarch_nb/logs``); see docs/logs.md.

        On a mesh of several hosts, each host's agent reads its ranks' files
        (within ``LOG_READ_TIMEOUT_S``).
        """
        selected = tuple(self._shape.ranks if ranks is None else ranks)
        for rank in selected:
            self._shape.index_of_rank(rank)  # raises for a rank outside this view
        group = self._group
        since = _logs.since_for_runs(since, runs, group.run_started)
        root = group.extra_env.get("MONARCH_NB_LOG_DIR")
        if group.agents is None:
            return _logs.read(
                group.name, selected, grep=grep, since=since, level=level, tail=tail, root=root
            )
        _, after, minimum = _logs.check_filters(grep, since, level, tail)
        request = ReadLogs(
            0,
            group.name,
            (),
            root or os.environ.get("MONARCH_NB_LOG_DIR", ""),
            grep,
            None if after is None else after.timestamp(),
            minimum,
            tail,
        )
        rows = group.agents.read_logs(group, selected, request, LOG_READ_TIMEOUT_S)
        lines = [
            _logs.LogLine(rank, dt.datetime.fromisoformat(time), stream, text)
            for rank, time, stream, text in rows
        ]
        return _logs.in_order(lines, tail)

    def logging_option(
        self,
        stream_to_client: bool = True,
        aggregate_window_sec: float | None = None,
        level: int = logging.INFO,
    ) -> Future[None]:
        """How ranks' output prints here (Monarch's call): ``stream_to_client=False``
        prints nothing (it stays in the log files, :meth:`logs`);
        ``aggregate_window_sec=W`` holds lines up to W seconds and prints identical
        ones once with their rank set, ``[0-7] epoch 3 done``.

        Applies to every view of the mesh, in a script and in a notebook (there
        to the cells run after it). Returns a done future (``await`` works as in
        Monarch). ``level`` (``logging.WARNING``, or its name) is the level of the
        ranks' root logger, set on every rank now, as Monarch's: records below it
        are dropped there, from the output and the log files alike.
        """
        try:
            logging.Logger("check").setLevel(level)  # what setLevel refuses, refused here
        except (TypeError, ValueError) as exc:
            raise MeshUsageError(
                f"logging_option(level={level!r}): {exc}; give a level such as "
                "logging.WARNING or 'WARNING'"
            ) from None
        option = check_option(stream_to_client, aggregate_window_sec)
        self._group.output_option = option
        if self._group.printer is not None:
            self._group.printer.configure(*option)
        self.run(f"__import__('logging').getLogger().setLevel({level!r})")
        return completed(None)

    @property
    def output_option(self) -> tuple[bool, float | None]:
        """``(stream_to_client, aggregate_window_sec)`` as :meth:`logging_option` set them."""
        return self._group.output_option
