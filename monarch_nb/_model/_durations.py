"""Durations written as Monarch writes them: ``"30s"``, ``"500ms"``, ``"1h 30m"``.

Monarch's duration settings take the ``humantime`` notation: integers, each
followed by a unit, optionally separated by spaces (``"1h30m"`` is
``"1h 30m"``). A bare number has no unit and is refused. ``format`` writes the
canonical form Monarch's ``get_global_config()`` reports: the largest units
first, zero parts left out (``"90s"`` reads back as ``"1m 30s"``).
"""

from __future__ import annotations

import re

_NS_PER_S = 1_000_000_000
_YEAR_S = 31_557_600  # 365.25 days
_MONTH_S = 2_630_016  # 30.44 days

# Every spelling of every unit, in nanoseconds.
_UNITS: dict[str, int] = {}
for _names, _ns in (
    (("nanos", "nsec", "ns"), 1),
    (("usec", "us", "µs"), 1_000),
    (("millis", "msec", "ms"), 1_000_000),
    (("seconds", "second", "secs", "sec", "s"), _NS_PER_S),
    (("minutes", "minute", "mins", "min", "m"), 60 * _NS_PER_S),
    (("hours", "hour", "hrs", "hr", "h"), 3600 * _NS_PER_S),
    (("days", "day", "d"), 86_400 * _NS_PER_S),
    (("weeks", "week", "w"), 604_800 * _NS_PER_S),
    (("months", "month", "M"), _MONTH_S * _NS_PER_S),
    (("years", "year", "y"), _YEAR_S * _NS_PER_S),
):
    for _name in _names:
        _UNITS[_name] = _ns

_PART = re.compile(r"\s*(\d+)\s*([A-Za-zµ]+)")

EXAMPLES = "'30s', '500ms' or '1m 30s'"


class DurationFormatError(ValueError):
    """Text that is not a duration; the message says what is wrong with it."""


def parse_ns(text: str) -> int:
    """Nanoseconds in ``text`` (``"1m 30s"`` -> 90_000_000_000).

    Raises:
        DurationFormatError: empty text, a number without a unit, an unknown
            unit, or anything else that is not a number and a unit.
    """
    if not text.strip():
        raise DurationFormatError("empty duration")
    total, pos = 0, 0
    while pos < len(text):
        if not text[pos:].strip():
            break
        match = _PART.match(text, pos)
        if match is None:
            rest = text[pos:].strip()
            if rest.isdigit():
                raise DurationFormatError(f"{rest!r} has no unit")
            raise DurationFormatError(f"expected a number and a unit at {rest!r}")
        number, unit = match.groups()
        if unit not in _UNITS:
            raise DurationFormatError(f"unknown unit {unit!r}")
        total += int(number) * _UNITS[unit]
        pos = match.end()
    return total


def parse_seconds(text: str) -> float:
    """Seconds in ``text``, as a float (``"500ms"`` -> 0.5)."""
    return parse_ns(text) / _NS_PER_S


def format_ns(ns: int) -> str:
    """``ns`` nanoseconds in Monarch's canonical notation (``"1m 30s"``; ``"0s"``)."""
    seconds, nanos = divmod(max(0, ns), _NS_PER_S)
    years, seconds = divmod(seconds, _YEAR_S)
    months, seconds = divmod(seconds, _MONTH_S)
    days, seconds = divmod(seconds, 86_400)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    millis, nanos = divmod(nanos, 1_000_000)
    micros, nanos = divmod(nanos, 1_000)
    parts = []
    for value, singular, plural in (
        (years, "year", "years"),
        (months, "month", "months"),
        (days, "day", "days"),
    ):
        if value:
            parts.append(f"{value}{singular if value == 1 else plural}")
    for value, unit in (
        (hours, "h"),
        (minutes, "m"),
        (seconds, "s"),
        (millis, "ms"),
        (micros, "us"),
        (nanos, "ns"),
    ):
        if value:
            parts.append(f"{value}{unit}")
    return " ".join(parts) or "0s"


def format_seconds(seconds: float) -> str:
    """``seconds`` in Monarch's notation (``90.0`` -> ``"1m 30s"``)."""
    return format_ns(round(seconds * _NS_PER_S))
