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


def test_item_takes_every_dimension_by_keyword():
    vm = ValueMesh(Shape.from_sizes({"hosts": 2, "gpus": 3}), list("abcdef"))
    assert vm.item(hosts=1, gpus=0) == "d"
    assert vm.slice(hosts=1, gpus=2).item() == "f"  # a point: no dimensions left
    assert vm.slice(gpus=slice(1, 2)).item(hosts=0) == "b"  # a size-1 dimension may be left out
    with pytest.raises(MeshUsageError, match=r"every dimension .* missing \['gpus'\]"):
        vm.item(hosts=0)
    with pytest.raises(MeshUsageError, match=r"unknown \['procs'\]"):
        vm.item(hosts=0, gpus=0, procs=0)


def test_slice_and_flatten_are_views_of_the_same_values():
    vm = ValueMesh(Shape.from_sizes({"hosts": 2, "gpus": 3}), list("abcdef"))
    column = vm.slice(gpus=1)
    assert column.values() == ["b", "e"]
    assert column.shape.ranks == (1, 4)  # global ranks, as every view
    assert column[4] == "e"
    flat = vm.slice(gpus=[2, 0]).flatten("rank")
    assert flat.extent == {"rank": 4}
    assert [(p["rank"], p.rank, v) for p, v in flat.items()][:2] == [(0, 2, "c"), (1, 0, "a")]
    assert vm.split(gpus=("x",)).extent == {"hosts": 2, "x": 3}
    assert vm.rename(hosts="dp").item(dp=0, gpus=0) == "a"


def test_a_value_mesh_reads_its_shape_as_a_mesh_does():
    vm = ValueMesh(Shape.from_sizes({"hosts": 2, "gpus": 3}), list("abcdef"))
    assert vm.sizes == {"hosts": 2, "gpus": 3}
    assert vm.extent.nelements == 6
    assert vm.size("gpus") == 3
    assert vm.size() == len(vm) == 6
    assert next(p.extent for p, _ in vm.slice(hosts=0).items()) == {"gpus": 3}
    assert "hosts\\gpus" in vm.to_table()
