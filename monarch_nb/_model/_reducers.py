"""The named reducers: a closed set of folds that host agents may run on replies.

``Accumulator(actors.value, 0, "sum")`` names one of :data:`REDUCERS` instead
of passing a function; the replies are then folded where they pass (by each
host's agent, for its ranks and the subtrees below it; see docs/scale.md), and
the controller gets one partial fold per subtree. A function as ``combine``
keeps folding at the controller: agents never run the caller's code.

Every fold here gives the same answer whatever the order and the grouping of
the replies, so a tree of any shape gives what one host gives:

- ``"sum"``: the exact sum of the replies, rounded once at the end when a
  float is among them (as :func:`math.fsum`; a left fold in rank order can
  differ from it in the last bits); ints (and bools) only: an int.
- ``"min"``/``"max"``: the smallest/largest reply; between equal ones, the
  lowest rank's (as ``min``/``max`` over the replies in rank order); a NaN
  makes the result NaN.
- ``"equal"``: the one value every rank replied (``int``, ``float``, ``bool``,
  ``str`` or ``None``, compared with their types: ``1``, ``1.0`` and ``True``
  differ); a :class:`ValueError` naming the ranks of each value when they
  differ (the first few of each).

Replies must be numbers (``int``, ``float``, ``bool``; an ``int``/``float``
subclass or anything with ``__index__``, as a NumPy scalar, is converted);
anything else, a tensor included, is that rank's ``TypeError``. A
:class:`Partial` crosses the wire as JSON (:meth:`Partial.to_json`), never
as a pickle, and :meth:`Partial.from_json` admits only what a partial holds.
"""

from __future__ import annotations

import json
import math
import operator
from fractions import Fraction
from typing import Any

from ._errors import MeshUsageError
from ._fold import format_ranks

REDUCERS = ("sum", "min", "max", "equal")
CODES = {name: i for i, name in enumerate(REDUCERS)}  # the byte a cast's envelope carries
_NUMBERS = (int, float, bool)
_SCALARS = (int, float, bool, str, type(None))
_FIRST_RANKS = 3  # ranks kept per distinct value of "equal", to name them


def check_reducer(name: Any, identity: Any) -> str:
    """``name`` if it is a reducer and ``identity`` suits it; else MeshUsageError."""
    if name not in REDUCERS:
        raise MeshUsageError(
            f"Accumulator's combine {name!r} is not a reducer agents can run: give one of "
            f"{', '.join(map(repr, REDUCERS))}, or a function (folded at the controller)"
        )
    if name != "equal" and not (identity is None or type(identity) in _NUMBERS):
        raise MeshUsageError(
            f"Accumulator(..., {identity!r}, {name!r}): the identity of {name!r} is an "
            "int, a float or None"
        )
    return str(name)


def as_number(value: Any) -> Any:
    """``value`` as an int, float or bool; TypeError if it is not a number."""
    kind = type(value)
    if kind in _NUMBERS:
        return value
    if isinstance(value, bool | int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if hasattr(kind, "__index__") and not hasattr(value, "shape"):
        return operator.index(value)
    if hasattr(kind, "__float__") and not hasattr(value, "shape"):
        return float(value)
    raise TypeError(type(value).__name__)


def type_error(reducer: str, rank: int, value: Any) -> str:
    """Rank ``rank``'s TypeError (its failure names the rank)."""
    return (
        f"the reducer {reducer!r} folds numbers (int, float, bool)"
        + (", str and None" if reducer == "equal" else "")
        + f"; this rank returned a {type(value).__name__}: return a number (e.g. "
        "tensor.item()), or give Accumulator a function as combine (folded at the controller)"
    )


class Partial:
    """What a set of replies folds to so far (any order, any grouping)."""

    __slots__ = ("count", "reducer", "state")

    def __init__(self, reducer: str) -> None:
        self.reducer = reducer
        self.count = 0
        # sum: [numerator, denominator, saw a float, +inf, -inf, nan]
        # min/max: [value, rank, nan] once a value came
        # equal: {key: [value, count, first ranks]}
        self.state: Any = {} if reducer == "equal" else None

    def add(self, rank: int, value: Any) -> str | None:
        """Fold rank ``rank``'s reply; a message (the rank's TypeError) if it cannot be."""
        try:
            if self.reducer == "equal":
                if type(value) not in _SCALARS:
                    value = as_number(value)
            else:
                value = as_number(value)
        except TypeError:
            return type_error(self.reducer, rank, value)
        self.count += 1
        if self.reducer == "sum":
            self._merge_sum(_sum_of(value))
        elif self.reducer == "equal":
            self._merge_equal({_key(value): [value, 1, [rank]]})
        else:
            self._merge_extreme([value, rank, isinstance(value, float) and math.isnan(value)])
        return None

    def merge(self, other: Partial) -> None:
        if other.reducer != self.reducer:
            raise ValueError(f"a {other.reducer!r} partial folded into a {self.reducer!r} one")
        if other.count == 0:
            return
        self.count += other.count
        if self.reducer == "sum":
            self._merge_sum(other.state)
        elif self.reducer == "equal":
            self._merge_equal(other.state)
        else:
            self._merge_extreme(other.state)

    def _merge_sum(self, other: list[Any]) -> None:
        if self.state is None:
            self.state = list(other)
            return
        mine = self.state
        if mine[1] == 1 and other[1] == 1:  # ints (and whole floats): no Fraction
            mine[0] += other[0]
        else:
            total = Fraction(mine[0], mine[1]) + Fraction(other[0], other[1])
            mine[0], mine[1] = total.numerator, total.denominator
        for i in (2, 3, 4, 5):
            mine[i] = mine[i] or other[i]

    def _merge_extreme(self, other: list[Any]) -> None:
        mine = self.state
        if mine is None:
            self.state = list(other)
            return
        nan = mine[2] or other[2]
        if not nan:
            better = operator.lt if self.reducer == "min" else operator.gt
            if better(other[0], mine[0]) or (other[0] == mine[0] and other[1] < mine[1]):
                mine[0], mine[1] = other[0], other[1]
        mine[2] = nan

    def _merge_equal(self, other: dict[str, list[Any]]) -> None:
        for key, (value, count, ranks) in other.items():
            mine = self.state.get(key)
            if mine is None:
                self.state[key] = [value, count, sorted(ranks)[:_FIRST_RANKS]]
            else:
                mine[1] += count
                mine[2] = sorted(mine[2] + list(ranks))[:_FIRST_RANKS]

    def result(self) -> Any:
        """The fold of every reply added (None if none was)."""
        if self.count == 0:
            return None
        state = self.state
        if self.reducer == "sum":
            numerator, denominator, saw_float, pos_inf, neg_inf, nan = state
            if nan or (pos_inf and neg_inf):
                return math.nan
            if pos_inf or neg_inf:
                return math.inf if pos_inf else -math.inf
            if saw_float:
                return float(Fraction(numerator, denominator))
            return numerator
        if self.reducer == "equal":
            if len(state) == 1:
                return next(iter(state.values()))[0]
            groups = sorted(state.values(), key=lambda g: g[2][0])
            said = "; ".join(
                f"{v!r} from {_ranks(c, first)}" for v, c, first in groups[: _FIRST_RANKS + 2]
            )
            more = "" if len(groups) <= _FIRST_RANKS + 2 else f"; and {len(groups) - 5} more"
            raise ValueError(
                f"the reducer 'equal' got {len(groups)} different values: {said}{more}"
            )
        return math.nan if state[2] else state[0]

    def finish(self, identity: Any) -> Any:
        """The result with the caller's identity folded in first (rank -1)."""
        value = self.result()
        if identity is None:
            return value
        if self.count == 0:
            return identity
        if self.reducer == "sum":
            whole = Partial("sum")
            whole.add(-1, identity)
            whole.merge(self)
            return whole.result()
        if self.reducer == "equal":
            if _key(identity) != _key(value):
                raise ValueError(
                    f"the reducer 'equal': every rank replied {value!r}, the identity is "
                    f"{identity!r}"
                )
            return value
        if isinstance(value, float) and math.isnan(value):
            return value
        return min(identity, value) if self.reducer == "min" else max(identity, value)

    # -- on the wire: JSON, never a pickle ------------------------------------------

    def to_json(self) -> bytes:
        state = self.state
        if self.reducer == "equal":
            state = [[v, c, r] for v, c, r in state.values()]
        return json.dumps([self.reducer, self.count, state], separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes | memoryview) -> Partial:
        """A partial from :meth:`to_json`'s bytes; ValueError if it is not one."""
        try:
            reducer, count, state = json.loads(bytes(data))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"not a folded reply: {exc}") from None
        if reducer not in REDUCERS or type(count) is not int or count < 0:
            raise ValueError("not a folded reply: its reducer or count")
        partial = cls(reducer)
        partial.count = count
        if count == 0:
            return partial
        if reducer == "sum":
            ok = (
                isinstance(state, list)
                and len(state) == 6
                and type(state[0]) is int
                and type(state[1]) is int
                and state[1] > 0
                and all(type(flag) is bool for flag in state[2:])
            )
        elif reducer == "equal":
            ok = isinstance(state, list) and all(
                isinstance(g, list)
                and len(g) == 3
                and type(g[0]) in _SCALARS
                and type(g[1]) is int
                and isinstance(g[2], list)
                and all(type(r) is int for r in g[2])
                for g in state
            )
            if ok:
                state = {_key(g[0]): g for g in state}
        else:
            ok = (
                isinstance(state, list)
                and len(state) == 3
                and type(state[0]) in _NUMBERS
                and type(state[1]) is int
                and type(state[2]) is bool
            )
        if not ok:
            raise ValueError(f"not a folded reply: a {reducer!r} partial's state")
        partial.state = state
        return partial


def _sum_of(value: Any) -> list[Any]:
    if isinstance(value, float):
        if math.isnan(value):
            return [0, 1, True, False, False, True]
        if math.isinf(value):
            return [0, 1, True, value > 0, value < 0, False]
        exact = Fraction(value)
        return [exact.numerator, exact.denominator, True, False, False, False]
    return [int(value), 1, False, False, False, False]


def _key(value: Any) -> str:
    """Equal values of the same type share a key (1, 1.0 and True do not)."""
    return f"{type(value).__name__}:{value!r}"


def _ranks(count: int, first: list[int]) -> str:
    if count == len(first):
        return f"rank{'s' if count > 1 else ''} {format_ranks(first)}"
    return f"{count} ranks ({', '.join(map(str, first))}, ...)"
