"""``monarch_nb.log_metric``: numbers a rank reports over time (loss, tokens/s).

A rank's points wait here and travel with its next heartbeat (every second),
so logging a metric in a training loop costs a lock and an append, never a
message of its own. ``procs.telemetry()`` on the controller reads them back
beside the rank's CPU, memory and GPU samples.
"""

from __future__ import annotations

import numbers
import threading
import time
from collections import deque
from typing import Any

from .._model._errors import MeshUsageError

# A rank that logs faster than heartbeats ship keeps its newest points.
MAX_PENDING = 10_000
MAX_NAME = 100

Point = tuple[float, str, float, "int | None"]  # (wall clock, name, value, step)

_lock = threading.Lock()
_pending: deque[Point] = deque(maxlen=MAX_PENDING)
_on_a_rank = False


def log_metric(name: str, value: Any, step: int | None = None) -> None:
    """Record ``value`` of metric ``name`` (at training step ``step``) on this rank;
    ``procs.telemetry()`` on the controller has it within a heartbeat.

    ``value`` is anything ``float()`` takes: a number, a NumPy scalar, a
    one-element tensor (``loss.item()`` is not needed)."""
    if not _on_a_rank:
        raise MeshUsageError(
            f"log_metric({name!r}) runs on a rank (in a %%mesh cell, an endpoint or a "
            "remote function), where its heartbeat carries it to the controller"
        )
    if not isinstance(name, str) or not name or len(name) > MAX_NAME:
        raise ValueError(
            f"log_metric(name={name!r}): give a non-empty string of at most {MAX_NAME} characters"
        )
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(
            f"log_metric({name!r}, value=...): a {type(value).__name__} is not a number "
            "(give an int, a float or a one-element tensor)"
        ) from None
    if step is not None and (isinstance(step, bool) or not isinstance(step, numbers.Integral)):
        raise TypeError(f"log_metric({name!r}, step={step!r}): step is an int or None")
    with _lock:
        _pending.append((time.time(), name, number, None if step is None else int(step)))


def on_a_rank() -> None:
    """This process is a rank: its wire thread ships what is logged (worker start-up)."""
    global _on_a_rank
    _on_a_rank = True


def drain() -> tuple[Point, ...]:
    """Every point logged since the last call, oldest first (the wire thread)."""
    with _lock:
        points = tuple(_pending)
        _pending.clear()
    return points
