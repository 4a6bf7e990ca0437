"""Errors of the tensor engine: an op that failed on a rank, and how it is reported.

Both sides use this module: a rank stores a :class:`DeferredError` in every
tensor an op failed to make (and in every tensor computed from those), and
the controller raises :class:`MeshTensorError` when it reads one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .._model._errors import RemoteError, RemoteFailure, format_ranks


@dataclass(frozen=True)
class DeferredError:
    """Why a rank has no value for a tensor: the root-cause op and where it was issued."""

    op: str  # e.g. "aten.mm.default" or "reduce('dp', 'sum')"
    source: str  # the controller-side "file:line" that issued it
    rank: int
    type_name: str
    message: str
    traceback: str

    def failure(self) -> RemoteFailure:
        text = f"{self.op} issued at {self.source}:\n{self.traceback.rstrip()}"
        return RemoteFailure(self.rank, self.type_name, self.message, text)


class MeshTensorError(RemoteError):
    """A torch op failed on some ranks; raised where the controller reads a value that
    depends on it. ``.op`` and ``.source`` name the root-cause op and the controller
    line that issued it; ``.ranks`` the ranks it failed on. The mesh stays usable.
    """

    what = "tensor op"

    def __init__(self, failures: Sequence[RemoteFailure], *, op: str = "", source: str = ""):
        self.op, self.source = op, source
        super().__init__(failures, actor=op, endpoint="")

    @classmethod
    def of(cls, errors: Sequence[DeferredError]) -> MeshTensorError:
        # Ranks that read a failure through a collective hold the root rank's error:
        # report each distinct root failure once.
        distinct = list(dict.fromkeys(errors))
        first = distinct[0]
        return cls([e.failure() for e in distinct], op=first.op, source=first.source)

    def _summary(self) -> str:
        groups = self.groups()
        ranks = format_ranks(self.ranks)
        failure = groups[0][1]
        text = (
            f"{self.op} issued at {self.source} failed on rank(s) {ranks}: "
            f"{failure.type_name}: {failure.message}"
        )
        if len(groups) > 1:
            text += f" (and {len(groups) - 1} other error(s); see .failures)"
        return text

    def __reduce__(self):
        return (_rebuild, (self.failures, self.op, self.source))


def _rebuild(failures, op, source):
    return MeshTensorError(failures, op=op, source=source)
