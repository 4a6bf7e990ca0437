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


# -- Monarch's shape vocabulary ----------------------------------------------------


def test_extent_is_a_mapping_with_labels_sizes_and_nelements():
    from monarch_nb import Extent

    extent = Shape.from_sizes({"hosts": 2, "gpus": 4}).extent
    assert isinstance(extent, Extent)
    assert extent == {"hosts": 2, "gpus": 4}
    assert extent["gpus"] == 4
    assert list(extent) == ["hosts", "gpus"]
    assert (extent.labels, extent.sizes, extent.nelements) == (["hosts", "gpus"], [2, 4], 8)
    assert pickle.loads(pickle.dumps(extent)) == extent
    with pytest.raises(KeyError):
        extent["procs"]


def test_size_of_a_dimension_of_several_and_of_all():
    shape = Shape.from_sizes({"hosts": 2, "gpus": 4})
    assert shape.size("gpus") == 4
    assert shape.size(["hosts", "gpus"]) == 8
    assert shape.size() == 8
    with pytest.raises(
        MeshUsageError, match=r"cannot take the size of 'procs'.*\['hosts', 'gpus'\]"
    ):
        shape.size("procs")


def test_points_know_the_extent_of_their_mesh():
    shape = Shape.from_sizes({"hosts": 2, "gpus": 4}).slice(gpus=slice(0, 2))
    point = shape.point_of_rank(5)
    assert point == {"hosts": 1, "gpus": 1}
    assert point.extent == {"hosts": 2, "gpus": 2}
    assert point.size("gpus") == 2
    assert pickle.loads(pickle.dumps(point)).extent == point.extent
    with pytest.raises(MeshUsageError, match="made without its mesh's extent"):
        _ = Point({"procs": 0}, 0).extent


def test_flatten_keeps_the_ranks_in_row_major_order():
    view = Shape.from_sizes({"hosts": 2, "gpus": 4}).slice(gpus=[3, 1])
    flat = view.flatten("rank")
    assert flat.extent == {"rank": 4}
    assert flat.ranks == (3, 1, 7, 5)


def test_split_with_monarchs_keywords_infers_one_size():
    shape = Shape.from_sizes({"hosts": 4, "gpus": 8})
    split = shape.split(hosts=("dp", "pp"), gpus=("tp", "cp"), pp=2, cp=4)
    assert split.extent == {"dp": 2, "pp": 2, "tp": 2, "cp": 4}
    assert split.ranks == shape.ranks
    assert shape.split(gpus=("tp", "cp"), tp=4).extent == {"hosts": 4, "tp": 4, "cp": 2}
    assert shape.split(gpus=["g"]).extent == {"hosts": 4, "g": 8}  # Monarch's rename
    # ours, beside it
    assert shape.split(gpus={"tp": 2, "cp": 4}).extent == {"hosts": 4, "tp": 2, "cp": 4}


def test_bad_splits_say_what_is_wrong():
    shape = Shape.from_sizes({"procs": 6})
    with pytest.raises(MeshUsageError, match=r"sizes of both 'a' and 'b'.*b=2"):
        shape.split(procs=("a", "b"))
    with pytest.raises(MeshUsageError, match=r"cannot split 'procs' \(size 6\).*multiply to 6"):
        shape.split(procs=("a", "b"), b=4)
    with pytest.raises(MeshUsageError, match=r"sizes \{'c': 2\} name no new dimension"):
        shape.split(procs=("a", "b"), b=3, c=2)
    with pytest.raises(MeshUsageError, match="must be the positive int size of a new one"):
        shape.split(gpus="x")
    with pytest.raises(MeshUsageError, match="give the new dimensions as a tuple of names"):
        shape.split(procs="ab")


def test_to_table_shows_the_rank_at_every_point():
    shape = Shape.from_sizes({"hosts": 2, "gpus": 3}, first_rank=10)
    assert shape.to_table().splitlines() == [
        "hosts\\gpus |  0 |  1 |  2",
        "-----------+----+----+---",
        "         0 | 10 | 11 | 12",
        "         1 | 13 | 14 | 15",
    ]
    assert shape.slice(hosts=1).to_table().splitlines()[-1] == "rank | 13 | 14 | 15"
    three = Shape.from_sizes({"a": 2, "b": 1, "c": 2}).to_table()
    assert three.startswith("a=0:\n")
    assert "\n\na=1:\n" in three
    assert Shape.from_sizes({"procs": 4}).slice(procs=2).to_table() == "rank 2"
