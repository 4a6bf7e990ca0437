"""Values given at the API, checked where they enter: timeouts and actor names.

Each check raises :class:`~._errors.MeshUsageError` naming the call, the bad
value (``!r``) and what to give instead, before anything is sent, so a bad
value never starts work whose result would then be lost.

A timeout is a number of seconds >= 0, or ``None`` to wait without limit;
``math.inf`` means the same as ``None``. NaN, negative numbers, strings and
bools are refused.
"""

from __future__ import annotations

import math
import numbers

from ._errors import MeshUsageError

# Actor names label log lines (``mesh/actor[rank]``), tracebacks, reprs and the
# dashboard: one line of text, and none of the characters that frame a label.
ACTOR_NAME_MAX = 200
_NAME_FRAMING = "/[]"


def _seconds(value: object) -> float | None:
    """``value`` as seconds (a real number, not a bool), or None if it is not one."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        return float(value)
    except OverflowError:  # an int too large for a float: longer than any wait
        return math.inf if isinstance(value, int) and value > 0 else -math.inf


def timeout(value: object, call: str, name: str = "timeout") -> float | None:
    """``name=value`` given to ``call``: None (wait without limit) or seconds >= 0.

    ``None`` and ``math.inf`` give None; a finite number >= 0 gives it as a
    float. Raises MeshUsageError for NaN, a negative number or a non-number.
    """
    if value is None:
        return None
    seconds = _seconds(value)
    if seconds is None or not seconds >= 0:  # (not >= also refuses NaN)
        raise MeshUsageError(
            f"{call}({name}={value!r}): a timeout is a number of seconds >= 0, or None "
            "(or math.inf) to wait without limit"
        )
    return None if seconds == math.inf else seconds


def bounded_timeout(value: object, call: str, name: str = "timeout") -> float:
    """``name=value`` given to ``call`` where the wait must end: finite seconds >= 0."""
    seconds = _seconds(value)
    if seconds is None or not 0 <= seconds < math.inf:
        raise MeshUsageError(
            f"{call}({name}={value!r}): give a finite number of seconds >= 0, e.g. {name}=5"
        )
    return seconds


def actor_name(name: object, call: str = "spawn") -> str:
    """``name`` if it can name an actor mesh: a non-empty string of at most
    ACTOR_NAME_MAX printable characters, without ``/``, ``[`` or ``]``."""
    if not isinstance(name, str) or not name:
        raise MeshUsageError(
            f"{call}({name!r}, ...): an actor's name is a non-empty string, "
            f"e.g. {call}('trainer', Trainer)"
        )
    if len(name) > ACTOR_NAME_MAX:
        raise MeshUsageError(
            f"{call}({name[:20]!r}..., ...): an actor's name is at most {ACTOR_NAME_MAX} "
            f"characters; this one has {len(name)}"
        )
    bad = sorted({c for c in name if not c.isprintable() or c in _NAME_FRAMING})
    if bad:
        raise MeshUsageError(
            f"{call}({name!r}, ...): an actor's name labels its log lines and tracebacks, "
            f"so it may not contain {''.join(bad)!r} (control characters, '/', '[' or ']'); "
            "use letters, digits, '_', '-' or '.'"
        )
    return name
