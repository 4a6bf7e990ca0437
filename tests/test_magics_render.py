"""widgets/_render.py: folded values, rank prefixes, labelled displays, status tables."""

from __future__ import annotations

import pytest

from monarch_nb import MeshState, MeshStatus, RankState, RankStatus, Shape, ValueMesh
from monarch_nb._wire._signed import WireStats
from monarch_nb.widgets._render import (
    NotebookMeshStatus,
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


def _rank(rank: int, state: RankState, work: str = "", seconds: float = 0.0) -> RankStatus:
    return RankStatus(
        rank=rank,
        point=Shape.from_sizes({"procs": 2}).point_of_rank(rank),
        host="h",
        pid=11 + rank,
        state=state,
        work=work,
        work_seconds=seconds,
        cpu_percent=12.4 if rank else None,
        rss_bytes=3 << 20,
        gpu_memory_allocated=None,
        gpu_memory_reserved=None,
        gpu_utilization=None,
        heartbeat_age=0.5,
        returncode=None,
        failure=None,
    )


def test_status_table_lists_every_rank():
    core = MeshStatus(
        name="m",
        state=MeshState.RUNNING,
        failure=None,
        shape=Shape.from_sizes({"procs": 2}),
        ranks=(_rank(0, RankState.IDLE), _rank(1, RankState.BUSY, "cell <mesh-cell-2>", 1.25)),
        wire=WireStats(),
        taken_at=0.0,
    )
    status = NotebookMeshStatus(core, "gloo", True)
    text = render_status([status])
    assert (
        text.splitlines()[0] == "mesh 'm' · running · 2 ranks · torch.distributed: gloo · default"
    )
    assert text.splitlines()[1].split() == [
        "rank", "host", "pid", "state", "current", "work", "cpu", "rss",
    ]  # fmt: skip
    assert text.splitlines()[2].split() == ["0", "h", "11", "idle", "-", "-", "3", "MiB"]
    assert text.splitlines()[3].split() == [
        "1", "h", "12", "busy", "%%mesh", "cell", "[2]", "(1.2", "s)", "12%", "3", "MiB",
    ]  # fmt: skip
    assert "<td>%%mesh cell [2] (1.2 s)</td>" in render_status_html([status])
    assert "no mesh is running" in render_status([])
