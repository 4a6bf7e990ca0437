import pickle

import pytest

from monarch_nb import MeshUsageError, Shape, ValueMesh


def test_items_values_len_and_indexing():
    shape = Shape.from_sizes({"hosts": 2, "procs": 2})
    vm = ValueMesh(shape, ["a", "b", "c", "d"])
    assert len(vm) == 4
    assert vm.values() == ["a", "b", "c", "d"]
    assert [(dict(p), v) for p, v in vm.items()][1] == ({"hosts": 0, "procs": 1}, "b")
    assert vm[2] == "c"
    assert vm[{"hosts": 1, "procs": 1}] == "d"
    assert [p.rank for p, _ in vm] == [0, 1, 2, 3]


def test_indexing_a_view_uses_global_ranks():
    vm = ValueMesh(Shape.from_sizes({"procs": 4}).slice(procs=[1, 3]), [10, 30])
    assert vm[3] == 30
    with pytest.raises(MeshUsageError, match="rank 0 is not in this mesh"):
        vm[0]
    with pytest.raises(MeshUsageError, match="not 'x'"):
        vm["x"]


def test_repr_folds_equal_values():
    assert repr(ValueMesh(Shape.from_sizes({"procs": 4}), [42] * 4)) == (
        "ValueMesh({procs: 4}) {0-3: 42}"
    )
    mixed = ValueMesh(Shape.from_sizes({"procs": 5}), [1, 1, 2, 1, 2])
    assert repr(mixed) == "ValueMesh({procs: 5}) {0-1,3: 1, 2,4: 2}"


def test_repr_stays_short_for_1000_ranks():
    vm = ValueMesh(Shape.from_sizes({"procs": 1000}), list(range(1000)))
    text = repr(vm)
    assert len(text) < 200
    assert text.endswith("... and 992 more}")
    assert len(repr(ValueMesh(Shape.from_sizes({"procs": 1000}), ["x" * 500] * 1000))) < 200


def test_value_mesh_pickles_and_compares():
    vm = ValueMesh(Shape.from_sizes({"procs": 2}), [1, 2])
    assert pickle.loads(pickle.dumps(vm)) == vm
    with pytest.raises(MeshUsageError, match="3 values for a shape of 2 points"):
        ValueMesh(Shape.from_sizes({"procs": 2}), [1, 2, 3])
