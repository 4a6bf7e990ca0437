import pickle

import pytest

from monarch_nb import MeshUsageError, Point, Shape


def test_dense_shape_rank_point_round_trip():
    shape = Shape.from_sizes({"hosts": 2, "gpus": 4})
    assert len(shape) == 8
    assert shape.point_of_rank(6) == {"hosts": 1, "gpus": 2}
    assert shape.point_of_rank(6).rank == 6
    for point in shape.points():
        assert shape.rank_of_point(point) == point.rank


def test_slice_with_int_drops_the_dimension():
    view = Shape.from_sizes({"hosts": 2, "gpus": 4}).slice(gpus=1)
    assert view.labels == ("hosts",)
    assert view.ranks == (1, 5)
    assert view.point_of_rank(5) == Point({"hosts": 1}, 5)


def test_slice_with_slice_and_list_keeps_the_dimension():
    shape = Shape.from_sizes({"hosts": 2, "gpus": 4})
    assert shape.slice(gpus=slice(1, 3)).ranks == (1, 2, 5, 6)
    assert shape.slice(gpus=[3, 0], hosts=1).ranks == (7, 4)
    assert shape.slice(gpus=[3, 0], hosts=1).extent == {"gpus": 2}
    assert shape.slice(gpus=-1).ranks == (3, 7)


def test_slice_of_a_slice_keeps_global_ranks():
    view = Shape.from_sizes({"procs": 8}).slice(procs=slice(2, 8, 2)).slice(procs=1)
    assert view.ranks == (4,)
    assert view.labels == ()


def test_bad_slices_name_the_problem():
    shape = Shape.from_sizes({"procs": 4})
    with pytest.raises(MeshUsageError, match=r"cannot slice by 'gpus'.*\['procs'\]"):
        shape.slice(gpus=0)
    with pytest.raises(MeshUsageError, match="procs=4 is out of range for size 4"):
        shape.slice(procs=4)
    with pytest.raises(MeshUsageError, match="selects no points"):
        shape.slice(procs=slice(3, 1))
    with pytest.raises(MeshUsageError, match="use an int, a slice or a list"):
        shape.slice(procs="0")


def test_unknown_rank_and_bad_point_are_named():
    shape = Shape.from_sizes({"procs": 4}).slice(procs=[0, 1])
    with pytest.raises(MeshUsageError, match="rank 3 is not in this mesh; its ranks are 0-1"):
        shape.point_of_rank(3)
    with pytest.raises(MeshUsageError, match="missing \\['procs'\\]"):
        shape.rank_of_point({"gpus": 0})


def test_shapes_and_points_pickle():
    shape = Shape.from_sizes({"a": 2, "b": 3}).slice(b=[0, 2])
    assert pickle.loads(pickle.dumps(shape)) == shape
    point = shape.point_of_rank(5)
    assert pickle.loads(pickle.dumps(point)) == point


def test_rename_and_split_keep_the_ranks_in_order():
    shape = Shape.from_sizes({"hosts": 2, "gpus": 4})
    assert shape.rename(gpus="tp").extent == {"hosts": 2, "tp": 4}
    grid = shape.split(gpus={"dp": 2, "tp": 2})
    assert grid.extent == {"hosts": 2, "dp": 2, "tp": 2}
    assert grid.ranks == shape.ranks
    assert grid.slice(tp=1, hosts=1).ranks == (5, 7)
    with pytest.raises(MeshUsageError, match=r"cannot rename 'procs'.*\['hosts', 'gpus'\]"):
        shape.rename(procs="x")
    with pytest.raises(MeshUsageError, match=r"split 'gpus' \(size 4\) into \{'dp': 3\}"):
        shape.split(gpus={"dp": 3})
    with pytest.raises(MeshUsageError, match=r"dimension names must be distinct"):
        shape.rename(gpus="hosts")
