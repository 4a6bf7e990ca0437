"""Named n-dimensional shapes over global ranks, and their points.

A :class:`Shape` is a row-major array of *global ranks* with named dimensions.
Slicing returns another Shape over a subset of the same ranks, which is how a
mesh view shares processes with its parent.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence

from ._errors import MeshUsageError, format_ranks
from ._public import publish

Selector = int | slice | Sequence[int]


class Point(Mapping[str, int]):
    """A point of a mesh: its coordinate per dimension, plus its global ``rank``.

    Behaves as a read-only mapping ``{"hosts": 0, "gpus": 3}``.
    """

    __slots__ = ("_coords", "rank")

    def __init__(self, coords: Mapping[str, int], rank: int) -> None:
        self._coords = dict(coords)
        self.rank = rank

    def __getitem__(self, dim: str) -> int:
        return self._coords[dim]

    def __iter__(self) -> Iterator[str]:
        return iter(self._coords)

    def __len__(self) -> int:
        return len(self._coords)

    def __repr__(self) -> str:
        coords = ", ".join(f"{k}={v}" for k, v in self._coords.items())
        return f"Point({coords}, rank={self.rank})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Point):
            return self.rank == other.rank and self._coords == other._coords
        return isinstance(other, Mapping) and dict(other) == self._coords

    def __hash__(self) -> int:
        return hash((self.rank, tuple(self._coords.items())))

    def __reduce__(self):
        return (Point, (self._coords, self.rank))


class Shape:
    """Dimension names and sizes, and the global rank at every point (row-major)."""

    __slots__ = ("_index", "labels", "ranks", "sizes")

    def __init__(self, labels: Sequence[str], sizes: Sequence[int], ranks: Sequence[int]):
        if len(labels) != len(sizes):
            raise MeshUsageError(f"{len(labels)} dimension names but {len(sizes)} sizes")
        if len(set(labels)) != len(labels):
            raise MeshUsageError(f"dimension names must be distinct, got {list(labels)!r}")
        total = 1
        for label, size in zip(labels, sizes, strict=True):
            if not isinstance(size, int) or size < 1:
                raise MeshUsageError(
                    f"dimension {label!r} must have a positive int size, got {size!r}"
                )
            total *= size
        if total != len(ranks):
            raise MeshUsageError(
                f"shape {dict(zip(labels, sizes, strict=False))} has {total} points, "
                f"got {len(ranks)} ranks"
            )
        self.labels: tuple[str, ...] = tuple(labels)
        self.sizes: tuple[int, ...] = tuple(sizes)
        self.ranks: tuple[int, ...] = tuple(ranks)
        self._index = {r: i for i, r in enumerate(self.ranks)}

    @classmethod
    def from_sizes(cls, sizes: Mapping[str, int], first_rank: int = 0) -> Shape:
        """A dense shape over ranks ``first_rank .. first_rank + product(sizes) - 1``."""
        total = 1
        for size in sizes.values():
            total *= size
        return cls(list(sizes), list(sizes.values()), range(first_rank, first_rank + total))

    def __len__(self) -> int:
        return len(self.ranks)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Shape) and (self.labels, self.sizes, self.ranks) == (
            other.labels,
            other.sizes,
            other.ranks,
        )

    def __hash__(self) -> int:
        return hash((self.labels, self.sizes, self.ranks))

    def __repr__(self) -> str:
        dims = zip(self.labels, self.sizes, strict=True)
        return "{" + ", ".join(f"{k}: {v}" for k, v in dims) + "}"

    def __reduce__(self):
        return (Shape, (self.labels, self.sizes, self.ranks))

    @property
    def extent(self) -> dict[str, int]:
        """``{dimension: size}``."""
        return dict(zip(self.labels, self.sizes, strict=False))

    # -- rank <-> point -------------------------------------------------------

    def coords(self, index: int) -> tuple[int, ...]:
        """Coordinates of the ``index``-th point (row-major)."""
        coords = []
        for size in reversed(self.sizes):
            index, c = divmod(index, size)
            coords.append(c)
        return tuple(reversed(coords))

    def point(self, index: int) -> Point:
        """The ``index``-th point of this shape (0 <= index < len)."""
        return Point(dict(zip(self.labels, self.coords(index), strict=False)), self.ranks[index])

    def points(self) -> Iterator[Point]:
        return (self.point(i) for i in range(len(self)))

    def index_of_rank(self, rank: int) -> int:
        """Position of global ``rank`` in this shape; clear error if absent."""
        try:
            return self._index[rank]
        except KeyError:
            raise MeshUsageError(
                f"rank {rank!r} is not in this mesh; its ranks are {format_ranks(self.ranks)}"
            ) from None

    def point_of_rank(self, rank: int) -> Point:
        """The point at which global ``rank`` sits."""
        return self.point(self.index_of_rank(rank))

    def index_of_point(self, point: Mapping[str, int]) -> int:
        """Row-major position of ``point`` (a mapping naming every dimension)."""
        missing = [d for d in self.labels if d not in point]
        extra = [d for d in point if d not in self.labels]
        if missing or extra:
            raise MeshUsageError(
                f"point {dict(point)!r} does not match dimensions {list(self.labels)!r}"
                + (f" (missing {missing})" if missing else "")
                + (f" (unknown {extra})" if extra else "")
            )
        index = 0
        for label, size in zip(self.labels, self.sizes, strict=False):
            c = point[label]
            if not 0 <= c < size:
                raise MeshUsageError(f"coordinate {label}={c!r} is outside 0..{size - 1}")
            index = index * size + c
        return index

    def rank_of_point(self, point: Mapping[str, int]) -> int:
        """The global rank at ``point``."""
        return self.ranks[self.index_of_point(point)]

    def _check_dims(self, verb: str, names: Iterable[str]) -> None:
        unknown = [d for d in names if d not in self.labels]
        if unknown:
            raise MeshUsageError(
                f"cannot {verb} {unknown[0]!r}: this mesh's dimensions are {list(self.labels)!r}"
            )

    # -- slicing --------------------------------------------------------------

    def slice(self, **selection: Selector) -> Shape:
        """A sub-shape: an int drops the dimension, a slice or a list of ints keeps it.

        Example: ``Shape.from_sizes({"hosts": 2, "gpus": 4}).slice(gpus=0)`` has
        dimension ``hosts`` only, over ranks 0 and 4.
        """
        self._check_dims("slice by", selection)
        kept_labels: list[str] = []
        kept_sizes: list[int] = []
        per_dim: list[list[int]] = []
        for label, size in zip(self.labels, self.sizes, strict=False):
            chosen = _resolve(label, size, selection.get(label, slice(None)))
            per_dim.append(chosen)
            if not isinstance(selection.get(label), int):
                kept_labels.append(label)
                kept_sizes.append(len(chosen))
        strides = [1] * len(self.sizes)
        for i in range(len(self.sizes) - 2, -1, -1):
            strides[i] = strides[i + 1] * self.sizes[i + 1]
        ranks = [
            self.ranks[sum(c * s for c, s in zip(combo, strides, strict=False))]
            for combo in itertools.product(*per_dim)
        ]
        return Shape(kept_labels, kept_sizes, ranks)

    # -- reshaping (same ranks, same order) -------------------------------------

    def rename(self, **new_names: str) -> Shape:
        """The same points with dimensions renamed: ``shape.rename(procs="dp")``."""
        self._check_dims("rename", new_names)
        labels = [new_names.get(label, label) for label in self.labels]
        return Shape(labels, self.sizes, self.ranks)

    def split(self, **dims: Mapping[str, int]) -> Shape:
        """The same points with a dimension split into several (row-major):
        ``Shape.from_sizes({"procs": 4}).split(procs={"dp": 2, "tp": 2})``.
        """
        self._check_dims("split", dims)
        labels: list[str] = []
        sizes: list[int] = []
        for label, size in zip(self.labels, self.sizes, strict=True):
            parts = dims.get(label)
            if parts is None:
                labels.append(label)
                sizes.append(size)
                continue
            total = 1
            for part in parts.values():
                total *= part if isinstance(part, int) else 0
            if not parts or total != size:
                raise MeshUsageError(
                    f"cannot split {label!r} (size {size}) into {dict(parts)!r}: "
                    f"the sizes must multiply to {size}"
                )
            labels.extend(parts)
            sizes.extend(parts.values())
        return Shape(labels, sizes, self.ranks)


def _resolve(label: str, size: int, sel: Selector) -> list[int]:
    if isinstance(sel, bool):
        raise MeshUsageError(
            f"cannot slice {label!r} by a bool ({sel!r}); use an int, slice or list"
        )
    if isinstance(sel, int):
        if not -size <= sel < size:
            raise MeshUsageError(f"index {label}={sel!r} is out of range for size {size}")
        return [sel % size]
    if isinstance(sel, slice):
        chosen = list(range(size))[sel]
    elif isinstance(sel, Sequence) and not isinstance(sel, str):
        chosen = []
        for i in sel:
            if not isinstance(i, int) or not -size <= i < size:
                raise MeshUsageError(f"index {label}={i!r} is out of range for size {size}")
            chosen.append(i % size)
    else:
        raise MeshUsageError(
            f"cannot slice {label!r} by {sel!r}; use an int, a slice or a list of ints"
        )
    if not chosen:
        raise MeshUsageError(f"slicing {label}={sel!r} selects no points")
    return chosen


publish(globals())
