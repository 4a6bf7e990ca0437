"""magics/_selection.py: --ranks and --where, against a real mesh's shape."""

from __future__ import annotations

import pytest

from monarch_nb.magics._selection import SelectionError, parse_ranks, parse_where, select

pytestmark = pytest.mark.timeout(60)


def test_parse_ranks_lists_and_ranges():
    assert parse_ranks("0,2-3") == [0, 2, 3]
    assert parse_ranks(" 3, 1 ,1") == [1, 3]


@pytest.mark.parametrize(
    ("text", "match"), [("x", "'x' is not a rank"), ("3-1", "'3-1'"), (",", "selects no rank")]
)
def test_parse_ranks_names_the_bad_value(text, match):
    with pytest.raises(SelectionError, match=match):
        parse_ranks(text)


def test_parse_where_index_list_and_range():
    assert parse_where(["procs=1"]) == {"procs": 1}
    assert parse_where(["procs=1,3"]) == {"procs": [1, 3]}
    assert parse_where(["procs=0:2"]) == {"procs": slice(0, 2)}


def test_parse_where_rejects_garbage():
    with pytest.raises(SelectionError, match="'procs=a'"):
        parse_where(["procs=a"])
    with pytest.raises(SelectionError, match="DIM=INDEX"):
        parse_where(["procs"])


def test_select_views_share_processes(procs4):
    assert select(procs4).shape.ranks == (0, 1, 2, 3)
    assert select(procs4, "0,2-3").shape.ranks == (0, 2, 3)
    assert select(procs4, [1]).pids == [procs4.pids[1]]
    assert select(procs4, where=["procs=1:3"]).shape.ranks == (1, 2)


def test_select_errors_name_the_mesh_and_value(procs4):
    with pytest.raises(SelectionError, match=r"has ranks 0-3, not 7"):
        select(procs4, "1,7")
    with pytest.raises(SelectionError, match="no dimension 'gpus'"):
        select(procs4, where=["gpus=0"])
    with pytest.raises(SelectionError, match="not both"):
        select(procs4, "0", ["procs=0"])
