"""Failures grouped by exception type and code location, messages folded by rank; and
the hang verdict's words for idle and unread ranks (no processes: plain data)."""

from __future__ import annotations

from test_diagnose import IN_ALL_REDUCE

from monarch_nb._controller._diagnose import Diagnosis, RankPlace, classify, parse_python_stack
from monarch_nb._model._errors import CellError, RemoteFailure
from monarch_nb._model._failure_fold import fold_traceback


def _traceback(message: str, line: int = 2) -> str:
    return (
        "Traceback (most recent call last):\n"
        f'  File "<mesh-cell-1>", line {line}, in <module>\n'
        "    raise ValueError(f'bad value {rank}')\n"
        f"ValueError: {message}\n"
    )


def test_one_traceback_for_every_rank_with_the_messages_folded():
    failures = [
        RemoteFailure(r, "ValueError", f"bad value {r % 2}", _traceback(f"bad value {r % 2}"))
        for r in range(4)
    ]
    error = CellError(failures, actor="cell <mesh-cell-1>")
    text = error.render()
    assert text.count("Traceback (most recent call last)") == 1
    assert "--- Traceback of where the remote call failed (rank 0-3):" in text
    assert text.endswith("ValueError: [0,2] bad value 0\n            [1,3] bad value 1")
    assert str(error) == (
        "cell <mesh-cell-1> failed on ranks 0-3: ValueError: bad value 0 "
        "(rank 0's; 2 different messages)"
    )


def test_another_line_or_type_is_another_group():
    failures = [
        RemoteFailure(0, "ValueError", "a", _traceback("a")),
        RemoteFailure(1, "ValueError", "b", _traceback("b", line=3)),
        RemoteFailure(2, "KeyError", "a", _traceback("a").replace("ValueError: a", "KeyError: a")),
    ]
    assert [ranks for ranks, _ in CellError(failures).groups()] == [(0,), (1,), (2,)]


def test_a_message_the_traceback_does_not_end_with_is_listed_under_it():
    text = fold_traceback("Traceback ...\nSomething else\n", "ValueError", [(0, "a"), (1, "b")])
    assert text == (
        "Traceback ...\nSomething else\n--- the message differs by rank (ValueError):\n[0] a\n[1] b"
    )


def _in_all_reduce(rank: int) -> RankPlace:
    return classify(rank, parse_python_stack(IN_ALL_REDUCE), "step", 3.0)


def test_an_idle_rank_a_collective_waits_for_is_named_idle():
    places = (_in_all_reduce(0), RankPlace(1, None, None, "", 0.0), _in_all_reduce(2))
    verdict = Diagnosis("m", places, "stacks").verdict()
    assert verdict == (
        "→ rank 1 never entered all_reduce (idle: the call or cell ended there without "
        "calling it): the others wait for it"
    )


def test_every_rank_read_in_the_collective_is_not_every_rank_when_some_were_not_read():
    places = (_in_all_reduce(0), _in_all_reduce(1))
    assert "every rank is in the collective" in Diagnosis("m", places, "stacks").verdict()
    partial = Diagnosis("m", places, "stacks", unread=(2, 3)).verdict()
    assert "every rank read is in the collective; ranks 2-3 of mesh 'm' were not read" in partial
