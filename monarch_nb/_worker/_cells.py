"""The ``%%mesh`` cells a rank runs, and the values pushed to and pulled from it.

They run in one persistent namespace per rank (:mod:`._namespace`), made for
the first cell: a worker that only hosts actors never loads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._runtime import _context
from .._wire._messages import Failure, Pull, Push, RunCell
from ._answers import FAILED, Answers
from ._running import Running

if TYPE_CHECKING:
    from ._namespace import RankNamespace, Worker


class Cells:
    """A rank's cells: their namespace, once one ran, and the messages that use it."""

    def __init__(self, worker: Worker, running: Running, answers: Answers) -> None:
        self._worker = worker
        self._running = running
        self._answers = answers
        self.namespace: RankNamespace | None = None

    def on_cell(self, message: RunCell | Push | Pull, frames: list[Any]) -> None:
        call_id = message.call_id
        match message:
            case RunCell(_, filename):
                label = filename
            case Pull(_, name):
                label = f"pull {name!r}"
            case _:
                label = "push"
        answers = self._answers
        decoded = answers.decode_or_fail(call_id, True, label, frames)
        if decoded is FAILED:
            return
        if self.namespace is None:
            from ._namespace import RankNamespace

            self.namespace = RankNamespace(self._worker)
        ns = self.namespace
        previous = _context.set_current(ns.context)
        try:
            match message:
                case RunCell(_, filename):
                    result = self._running.user_code(
                        f"cell {filename}", ns.execute, (filename, decoded)
                    )
                case Push():
                    ns.globals.update(decoded)
                    result = None
                case Pull(_, name):
                    result = ns.pull(name)
        except BaseException as exc:
            answers.controller_route.send(Failure(call_id, answers.failure_of(exc), False))
            return
        finally:
            _context.set_current(previous)
        answers.reply_value(call_id, result)

    def renumber(self) -> None:
        """The rank moved into a resized mesh: the namespace (kept) takes its new place."""
        if self.namespace is not None:
            self.namespace.renumber()
