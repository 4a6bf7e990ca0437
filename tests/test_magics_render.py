"""magics/_render.py: folded values, rank prefixes, labelled displays, status tables."""

from __future__ import annotations

import pytest

from monarch_nb import Shape, ValueMesh
from monarch_nb.magics._render import (
    MeshStatus,
    RankStatus,
    fold_values,
    label_bundle,
    rank_prefix,
    render_status,
    render_status_html,
)

pytestmark = pytest.mark.timeout(30)
SHAPE4 = Shape.from_sizes({"procs": 4})


def test_equal_values_fold_to_one_line():
    assert fold_values(ValueMesh(SHAPE4, [6.0] * 4)) == "[0-3] 6.0"


def test_different_values_one_line_per_group_in_rank_order():
    text = fold_values(ValueMesh(SHAPE4, [1, 2, 1, 2]))
    assert text.splitlines() == ["[0,2] 1", "[1,3] 2"]


def test_multiline_repr_is_indented_under_its_label():
    class Two:
        def __repr__(self) -> str:
            return "a\nb"

    assert fold_values(ValueMesh(Shape.from_sizes({"procs": 1}), [Two()])) == "[0] a\n    b"


def test_broken_repr_does_not_hide_other_ranks():
    class Bad:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    text = fold_values(ValueMesh(Shape.from_sizes({"procs": 2}), [Bad(), 5]))
    assert "[0] <repr failed: RuntimeError: no>" in text
    assert "[1] 5" in text


def test_progress_line_keeps_what_a_terminal_shows():
    assert rank_prefix(2, " 10%|#\r 50%|#####\r100%|##########") == "[2] 100%|##########\n"
    assert rank_prefix(0, "done\r") == "[0] done\n"


def test_label_bundle_tags_rank_in_text_html_and_metadata():
    data, md = label_bundle(3, {"text/html": "<b>x</b>", "text/plain": "X"}, {})
    assert data["text/plain"] == "[3] X"
    assert "[rank 3]" in data["text/html"]
    assert data["text/html"].endswith("<b>x</b>")
    assert md == {"monarch_nb": {"rank": 3}}


def test_status_table_lists_every_rank():
    status = MeshStatus(
        "m",
        "running",
        None,
        "gloo",
        True,
        (RankStatus(0, "h", 11, "running", "idle"), RankStatus(1, "h", 12, "running", "cell [2]")),
    )
    text = render_status([status])
    assert (
        text.splitlines()[0] == "mesh 'm' · running · 2 ranks · torch.distributed: gloo · default"
    )
    assert text.splitlines()[1].split() == ["rank", "host", "pid", "state", "current", "work"]
    assert text.splitlines()[3].split() == ["1", "h", "12", "running", "cell", "[2]"]
    assert "<td>cell [2]</td>" in render_status_html([status])
    assert "no mesh is running" in render_status([])
