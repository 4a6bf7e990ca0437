"""How a mesh prints its ranks' output: Monarch's ``logging_option``.

:class:`OutputPrinter` observes a mesh's :class:`~._events.Output` events.
By default it prints each line as it comes, prefixed by its rank (unless
the ``prefix_with_rank`` setting was off when the mesh was made). With
``stream_to_client=False`` it prints nothing (the lines are still in each
rank's log file, see ``ProcMesh.logs()``). With ``aggregate_window_sec=W``,
lines are held for up to W seconds from the first one held, then identical
lines (same text, same stream) print once, labelled by their rank set, in
the order they first came: ``[0-7] epoch 3 done``. Progress-bar redraws
(lines ending in ``\\r``) are never held. A script's mesh has one printer;
a notebook gives each cell's output one (``magics._output``).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

from .._model._errors import MeshUsageError
from .._model._fold import format_ranks
from .._services import _config
from ._events import Output


def _write(stream: str, text: str) -> None:
    out = sys.stderr if stream == "stderr" else sys.stdout
    out.write(text)
    out.flush()


def check_option(
    stream_to_client: bool, aggregate_window_sec: float | None
) -> tuple[bool, float | None]:
    """``logging_option``'s arguments, checked (MeshUsageError) and normalised."""
    if not isinstance(stream_to_client, bool):
        raise MeshUsageError(f"stream_to_client must be True or False, got {stream_to_client!r}")
    window = aggregate_window_sec
    if window is not None and (
        isinstance(window, bool) or not isinstance(window, int | float) or window <= 0
    ):
        raise MeshUsageError(
            f"aggregate_window_sec must be a positive number of seconds or None, got {window!r}"
        )
    return stream_to_client, None if window is None else float(window)


class OutputPrinter:
    """The observer that prints a script's mesh output (see the module docstring)."""

    def __init__(self, write: Callable[[str, str], None] = _write) -> None:
        self._write = write
        self._lock = threading.Lock()
        self.stream_to_client = True
        self.aggregate_window_sec: float | None = None
        # Read when the mesh is made, as Monarch reads it when it wires its forwarders.
        self.prefix_with_rank: bool = _config.get("prefix_with_rank")
        # (stream, text) -> ranks, in the order first seen, while a window is open.
        self._held: dict[tuple[str, str], list[int]] = {}
        self._timer: threading.Timer | None = None

    def configure(self, stream_to_client: bool, aggregate_window_sec: float | None) -> None:
        stream_to_client, window = check_option(stream_to_client, aggregate_window_sec)
        self.flush()  # what was held under the old setting prints under it
        with self._lock:
            self.stream_to_client = stream_to_client
            self.aggregate_window_sec = window

    def __call__(self, event: Output) -> None:
        if not self.stream_to_client:
            return
        window = self.aggregate_window_sec
        if window is None or event.end != "\n":
            if window is not None:
                self.flush()  # keep the order of what was held before this line
            prefix = f"[{event.rank}] " if self.prefix_with_rank else ""
            self._write(event.stream, f"{prefix}{event.line}{event.end}")
            return
        with self._lock:
            self._held.setdefault((event.stream, event.line), []).append(event.rank)
            if self._timer is None:
                self._timer = threading.Timer(window, self.flush)
                self._timer.daemon = True
                self._timer.start()

    def flush(self) -> None:
        """Print what is held now (a window's end, a setting change, the mesh's stop)."""
        with self._lock:
            held, self._held = self._held, {}
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        for (stream, text), ranks in held.items():
            self._write(stream, f"[{format_ranks(ranks)}] {text}\n")
