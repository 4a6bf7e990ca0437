"""_model/_hints.py: a script is told the method, a notebook the magic."""

from __future__ import annotations

import pytest

from monarch_nb import MeshFailure
from monarch_nb._model import _hints

pytestmark = pytest.mark.timeout(60)


def test_the_runtime_names_the_method_unless_told_otherwise():
    assert _hints.restart_hint("m") == "call restart() on process mesh 'm'"
    _hints.set_restart_hint(lambda mesh: "run %mesh restart" if mesh == "nb" else None)
    try:
        assert _hints.restart_hint("nb") == "run %mesh restart"
        assert _hints.restart_hint("m") == "call restart() on process mesh 'm'"
    finally:
        _hints.set_restart_hint(None)


def test_a_dead_rank_in_a_script_names_the_method(procs2):
    procs2.kill([1])
    with pytest.raises(MeshFailure, match=r"call restart\(\) on process mesh 'procs'"):
        procs2.run("1", timeout=30)
