"""Named n-dimensional shapes over global ranks, and their points.

A :class:`Shape` is a row-major array of *global ranks* with named dimensions.
Slicing returns another Shape over a subset of the same ranks, which is how a
mesh view shares processes with its parent.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from ._errors import MeshUsageError, format_ranks
from ._public import publish

Selector = int | slice | Sequence[int]
M = TypeVar("M", bound="MeshShape")


class Extent(Mapping[str, int]):
    """Dimension names and their sizes, as Monarch's ``Extent``: a read-only mapping
    ``{"hosts": 2, "gpus": 4}`` that also has ``.labels``, ``.sizes`` and ``.nelements``.
    """

    __slots__ = ("_labels", "_sizes")

    def __init__(self, labels: Sequence[str], sizes: Sequence[int]) -> None:
        if len(labels) != len(sizes):
            raise MeshUsageError(f"{len(labels)} dimension names but {len(sizes)} sizes")
        self._labels: tuple[str, ...] = tuple(labels)
        self._sizes: tuple[int, ...] = tuple(sizes)

    # Lists, as Monarch's are (``extent.labels == ["hosts"]``); new ones each time,
    # so the extent itself stays immutable.
    @property
    def labels(self) -> list[str]:
        """The dimension names, outermost first."""
        return list(self._labels)

    @property
    def sizes(self) -> list[int]:
        """The size of each dimension, in the order of ``labels``."""
        return list(self._sizes)

    @property
    def nelements(self) -> int:
        """The number of points: the product of the sizes."""
        total = 1
        for size in self._sizes:
            total *= size
        return total

    def __getitem__(self, label: str) -> int:
        try:
            return self._sizes[self._labels.index(label)]
        except ValueError:
            raise KeyError(label) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._labels)

    def __len__(self) -> int:
        return len(self._labels)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self) == dict(other)

    def __hash__(self) -> int:
        return hash((self._labels, self._sizes))

    def __repr__(self) -> str:
        return f"Extent({dict(self)!r})"

    def __reduce__(self):
        return (Extent, (self._labels, self._sizes))


class Point(Mapping[str, int]):
    """A point of a mesh: its coordinate per dimension, plus its global ``rank``.

    Behaves as a read-only mapping ``{"hosts": 0, "gpus": 3}``. A point taken
    from a shape also knows that shape's ``extent`` (``point.size("gpus")``).
    """

    __slots__ = ("_coords", "_extent", "rank")

    def __init__(self, coords: Mapping[str, int], rank: int, extent: Extent | None = None) -> None:
        self._coords = dict(coords)
        self.rank = rank
        self._extent = extent

    @property
    def extent(self) -> Extent:
        """The sizes of the mesh this point belongs to."""
        if self._extent is None:
            raise MeshUsageError(
                f"point {self!r} (rank {self.rank}) was made without its mesh's extent; "
                "take points from a mesh "
                "(mesh.shape.point_of_rank(r), ValueMesh.items()) to know their extent"
            )
        return self._extent

    def size(self, label: str) -> int:
        """The size of dimension ``label`` of the mesh this point belongs to."""
        return self.extent[label]

    def __getitem__(self, dim: str) -> int:
        return self._coords[dim]

    def __iter__(self) -> Iterator[str]:
        return iter(self._coords)

    def __len__(self) -> int:
        return len(self._coords)

    def __repr__(self) -> str:
        """As Monarch prints a point: ``{'hosts': 0/1, 'gpus': 1/2}``, each coordinate
        over its dimension's size (``{'gpus': 1}`` for a point made without an extent)."""
        extent = self._extent
        parts = (
            f"{k!r}: {v}/{extent[k]}" if extent is not None and k in extent else f"{k!r}: {v}"
            for k, v in self._coords.items()
        )
        return "{" + ", ".join(parts) + "}"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Point):
            return self.rank == other.rank and self._coords == other._coords
        return isinstance(other, Mapping) and dict(other) == self._coords

    def __hash__(self) -> int:
        return hash((self.rank, tuple(self._coords.items())))

    def __reduce__(self):
        return (Point, (self._coords, self.rank, self._extent))


class Shape:
    """Dimension names and sizes, and the global rank at every point (row-major)."""

    __slots__ = ("_extent", "_index", "labels", "ranks", "sizes")

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
        self._extent = Extent(self.labels, self.sizes)  # immutable: one for every point

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
        if not self.labels:  # one point (every dimension indexed away): say which
            return f"{{rank {self.ranks[0]}}}"
        dims = zip(self.labels, self.sizes, strict=True)
        return "{" + ", ".join(f"{k}: {v}" for k, v in dims) + "}"

    def __reduce__(self):
        return (Shape, (self.labels, self.sizes, self.ranks))

    @property
    def extent(self) -> Extent:
        """The dimensions and their sizes, a mapping ``{dimension: size}``."""
        return self._extent

    def size(self, dim: str | Sequence[str] | None = None) -> int:
        """Points along ``dim``, the product over several dims, or (None) all points."""
        if dim is None:
            return len(self.ranks)
        if isinstance(dim, str):
            self._check_dims("take the size of", [dim])
            return self.sizes[self.labels.index(dim)]
        total = 1
        for d in dim:
            total *= self.size(d)
        return total

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
        coords = dict(zip(self.labels, self.coords(index), strict=False))
        return Point(coords, self.ranks[index], self.extent)

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

        Indices count as Python's do: ``-1`` is the last point of a dimension.
        An index out of range, or a selection of no points, raises MeshUsageError.

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

    def flatten(self, name: str) -> Shape:
        """The same points, row-major, along one dimension called ``name``."""
        return Shape([name], [len(self.ranks)], self.ranks)

    def split(self, **dims: Any) -> Shape:
        """The same points with dimensions split into several (row-major).

        Two spellings. Ours names each new dimension with its size::

            Shape.from_sizes({"procs": 4}).split(procs={"dp": 2, "tp": 2})

        Monarch's names the new dimensions and gives sizes as keywords of their
        own; one size per split may be left out and is inferred::

            Shape.from_sizes({"hosts": 4, "gpus": 8}).split(hosts=("dp", "pp"), pp=2)
        """
        parts_of: dict[str, list[tuple[str, int | None]]] = {}
        sizes_given: dict[str, int] = {}
        for key, value in dims.items():
            if key in self.labels:
                if isinstance(value, Mapping):
                    parts_of[key] = list(value.items())
                elif isinstance(value, Sequence) and not isinstance(value, str):
                    parts_of[key] = [(part, None) for part in value]
                else:
                    raise MeshUsageError(
                        f"split({key}={value!r}): give the new dimensions as a tuple of names "
                        f"({key}=('dp', 'tp'), tp=2) "
                        f"or a dict of sizes ({key}={{'dp': 2, 'tp': 2}})"
                    )
            elif isinstance(value, int) and not isinstance(value, bool) and value > 0:
                sizes_given[key] = value
            else:
                raise MeshUsageError(
                    f"split({key}={value!r}): {key!r} is not a dimension of this mesh "
                    f"({list(self.labels)!r}), so it must be the positive int size of a new one"
                )
        labels: list[str] = []
        sizes: list[int] = []
        for label, size in zip(self.labels, self.sizes, strict=True):
            parts = parts_of.get(label, [(label, size)])
            resolved = [
                (part, given if given is not None else sizes_given.pop(part, None))
                for part, given in parts
            ]
            unknown = [part for part, given in resolved if given is None]
            known = 1
            for _, given in resolved:
                known *= given if given is not None else 1
            if len(unknown) > 1:
                raise MeshUsageError(
                    f"cannot infer the sizes of both {unknown[0]!r} and {unknown[1]!r} when "
                    f"splitting {label!r}; give one, e.g. {unknown[1]}=2"
                )
            if unknown and known > 0 and size % known == 0:
                resolved = [(p, g if g is not None else size // known) for p, g in resolved]
            elif unknown or known != size or not parts:
                raise MeshUsageError(
                    f"cannot split {label!r} (size {size}) into "
                    f"{ {p: ('?' if g is None else g) for p, g in resolved}!r}: "
                    f"the sizes must multiply to {size}"
                )
            labels.extend(p for p, _ in resolved)
            sizes.extend(g for _, g in resolved)  # type: ignore[misc]  # all resolved
        if sizes_given:
            raise MeshUsageError(
                f"split(): sizes {sizes_given!r} name no new dimension; "
                f"the new dimensions are {[p for p in labels if p not in self.labels]!r}"
            )
        return Shape(labels, sizes, self.ranks)

    def to_table(self) -> str:
        """The global rank at every point, as a text table (one per leading index past 2-D)."""
        return _table(self)


def _table(shape: Shape) -> str:
    if not shape.labels:
        return f"rank {shape.ranks[0]}"
    *outer, rows_label, cols_label = ("", *shape.labels) if len(shape.labels) == 1 else shape.labels
    cols = shape.extent[cols_label]
    rows = shape.extent[rows_label] if rows_label else 1
    per_table = rows * cols
    blocks = []
    outer_sizes = [shape.extent[d] for d in outer]
    for block, coords in enumerate(itertools.product(*(range(n) for n in outer_sizes))):
        ranks = shape.ranks[block * per_table : (block + 1) * per_table]
        head = [f"{rows_label}\\{cols_label}" if rows_label else cols_label]
        grid = [head + [str(c) for c in range(cols)]]
        for r in range(rows):
            cells = [str(rank) for rank in ranks[r * cols : (r + 1) * cols]]
            grid.append([str(r) if rows_label else "rank", *cells])
        width = [max(len(row[i]) for row in grid) for i in range(cols + 1)]
        lines = [
            " | ".join(cell.rjust(w) for cell, w in zip(row, width, strict=True)) for row in grid
        ]
        lines.insert(1, "-+-".join("-" * w for w in width))
        title = ", ".join(f"{d}={c}" for d, c in zip(outer, coords, strict=True))
        blocks.append((f"{title}:\n" if title else "") + "\n".join(lines))
    return "\n\n".join(blocks)


class MeshShape:
    """What every mesh (process, actor, value) says and does about its shape, as
    Monarch's meshes do: ``extent``, ``size()``, ``sizes``, and views that keep the
    same points (``slice``, ``flatten``, ``split``, ``rename``).

    A subclass has a ``shape`` and makes a view of itself with ``_new_with_shape``.
    """

    __slots__ = ()

    @property
    def shape(self) -> Shape:
        raise NotImplementedError

    def _new_with_shape(self: M, shape: Shape) -> M:
        raise NotImplementedError

    @property
    def extent(self) -> Extent:
        """The dimensions and their sizes: ``mesh.extent["gpus"]``."""
        return self.shape.extent

    @property
    def sizes(self) -> dict[str, int]:
        """``{dimension: size}``."""
        return dict(self.shape.extent)

    @property
    def _labels(self) -> list[str]:
        # Monarch's private name, which its SPMD example reads; ours is extent.labels.
        return self.shape.extent.labels

    def size(self, dim: str | Sequence[str] | None = None) -> int:
        """Points along ``dim`` (or the product over several), or all points."""
        return self.shape.size(dim)

    def slice(self: M, **selection: Selector) -> M:
        """A view of the selected points: an int drops the dimension, a slice or
        a list of ints keeps it: ``mesh.slice(hosts=0, gpus=slice(0, 2))``."""
        return self._new_with_shape(self.shape.slice(**selection))

    def flatten(self: M, name: str) -> M:
        """A view with every dimension folded into one called ``name`` (row-major)."""
        return self._new_with_shape(self.shape.flatten(name))

    def split(self: M, **dims: Any) -> M:
        """A view with dimensions split (see :meth:`Shape.split`):
        ``mesh.split(procs=("dp", "tp"), tp=2)`` or ``mesh.split(procs={"dp": 2, "tp": 2})``."""
        return self._new_with_shape(self.shape.split(**dims))

    def rename(self: M, **new_names: str) -> M:
        """A view with dimensions renamed: ``mesh.rename(procs="dp")``."""
        return self._new_with_shape(self.shape.rename(**new_names))

    def to_table(self) -> str:
        """The global rank at every point of this mesh, as a text table."""
        return self.shape.to_table()


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
