"""ValueMesh: one value per point of a mesh, with a repr that folds equal values."""

from __future__ import annotations

import reprlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Generic, TypeVar

from ._errors import MeshUsageError, format_ranks
from ._fold import MAX_GROUPS_SHOWN, fold, more
from ._public import publish
from ._shape import MeshShape, Point, Shape

T = TypeVar("T")

_short_repr = reprlib.Repr()
_short_repr.maxstring = 60
_short_repr.maxother = 60


class ValueMesh(MeshShape, Generic[T]):
    """The values a mesh produced, one per point.

    - ``vm[rank]`` (an int: a *global* rank) or ``vm[{"procs": 2}]`` (a point);
    - ``vm.item(procs=2)`` (Monarch's spelling: every dimension by keyword);
    - ``vm.items()`` yields ``(Point, value)``; ``vm.values()`` lists values;
    - ``len(vm)`` is the number of points; iteration yields ``(point, value)``;
    - as every mesh: ``.slice(procs=0)``, ``.flatten("rank")``, ``.extent``,
      ``.size(dim)``, ``.split(...)``, ``.rename(...)``: views over the same values.

    The repr folds equal values: ``ValueMesh({procs: 4}) {0-3: 42}``.
    """

    __slots__ = ("_shape", "_values")

    def __class_getitem__(cls, item: object) -> type[ValueMesh]:
        """``ValueMesh[int]`` is ``ValueMesh`` itself, as Monarch's: a type hint
        names the values, the class is the same."""
        return cls

    def __init__(self, shape: Shape, values: Sequence[T]) -> None:
        if len(values) != len(shape):
            raise MeshUsageError(f"{len(values)} values for a shape of {len(shape)} points")
        self._shape = shape
        self._values = list(values)

    @property
    def shape(self) -> Shape:
        """The points the values are at."""
        return self._shape

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[tuple[Point, T]]:
        return self.items()

    def items(self) -> Iterator[tuple[Point, T]]:
        """``(point, value)`` pairs in row-major order."""
        return ((self.shape.point(i), v) for i, v in enumerate(self._values))

    def item(self, **point: int) -> T:
        """The value at ``point``, every dimension by keyword: ``vm.item(hosts=0, gpus=3)``.

        Dimensions of size 1 may be left out, so a one-point mesh answers ``item()``.
        """
        full = {
            label: point.pop(label, 0) if size == 1 else point.pop(label)
            for label, size in zip(self.shape.labels, self.shape.sizes, strict=True)
            if label in point or size == 1
        }
        missing = [label for label in self.shape.labels if label not in full]
        if point or missing:
            raise MeshUsageError(
                f"item() takes every dimension of {self.shape!r} by keyword"
                + (f"; missing {missing}" if missing else "")
                + (f"; unknown {sorted(point)}" if point else "")
            )
        return self._values[self.shape.index_of_point(full)]

    def _new_with_shape(self, shape: Shape) -> ValueMesh[T]:
        # A view: the same values at the points the new shape keeps.
        return ValueMesh(shape, [self._values[self.shape.index_of_rank(r)] for r in shape.ranks])

    def values(self) -> list[T]:
        """The values in row-major order."""
        return list(self._values)

    def __getitem__(self, key: int | Mapping[str, int]) -> T:
        if isinstance(key, int) and not isinstance(key, bool):
            return self._values[self.shape.index_of_rank(key)]
        if isinstance(key, Mapping):
            return self._values[self.shape.index_of_point(key)]
        raise MeshUsageError(
            f"index a ValueMesh by a global rank (int) or a point (mapping), not {key!r}"
        )

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ValueMesh)
            and self.shape == other.shape
            and self._values == other._values
        )

    __hash__ = None  # type: ignore[assignment]  # mutable contents

    def groups(self) -> list[tuple[tuple[int, ...], str]]:
        """Ranks grouped by the repr of their value, first-seen order."""
        texts = (_short_repr.repr(value) for value in self._values)
        return fold(zip(self.shape.ranks, texts, strict=True))

    def __repr__(self) -> str:
        groups = self.groups()
        body = ", ".join(f"{format_ranks(r)}: {t}" for r, t in groups[:MAX_GROUPS_SHOWN])
        tail = more(len(groups))
        if tail:
            body += f", {tail}"
        return f"ValueMesh({self.shape!r}) {{{body}}}"

    def __reduce__(self):
        return (ValueMesh, (self.shape, self._values))


publish(globals())
