"""Running code cells on ranks: the runtime side of ``%%mesh``.

Each rank keeps one persistent namespace (per process mesh), with ``rank``,
``world_size``, ``local_rank`` and ``point`` predefined. A cell is compiled on
the controller first (a SyntaxError never reaches a worker), registered in
``linecache`` on both sides under one name so remote tracebacks show the
cell's source lines, then executed; the value of a trailing expression is
returned, like IPython's ``Out``.

Nothing here imports IPython: magics/ translates between this and a notebook.
"""

from __future__ import annotations

import ast
import linecache
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._calls import PendingCall
from ._context import Context
from ._future import Future
from ._shape import Shape

if TYPE_CHECKING:
    from ._proc_mesh import ProcMesh
    from ._worker import Worker

_cell_counter = iter(range(1, 1 << 62))


def cache_source(filename: str, source: str) -> None:
    """Make ``source`` visible to tracebacks under ``filename``."""
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)


def compile_cell(source: str, filename: str) -> tuple[Any, Any]:
    """Compile a cell as (body, trailing expression or None); raises SyntaxError."""
    tree = ast.parse(source, filename=filename, mode="exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    body = compile(tree, filename, "exec")
    expr = compile(last, filename, "eval") if last is not None else None
    return body, expr


# -- controller side ------------------------------------------------------------------


def run_cell(procs: ProcMesh, source: str, *, name: str | None = None) -> Future[Any]:
    """Run ``source`` on every rank of ``procs``; a future of the last expression's values.

    Raises SyntaxError at once (locally) if the cell does not compile.
    """
    filename = name or f"<mesh-cell-{next(_cell_counter)}>"
    compile_cell(source, filename)  # SyntaxError here, before anything is sent
    cache_source(filename, source)
    return _send(procs, ("exec", 0, filename), source, label=f"cell {filename}")


def push(procs: ProcMesh, values: Mapping[str, Any]) -> Future[Any]:
    """Set names in every rank's namespace (the values are pickled once)."""
    return _send(procs, ("push", 0), dict(values), label="push")


def pull(procs: ProcMesh, name: str) -> Future[Any]:
    """A future of a ValueMesh of ``name`` in every rank's namespace."""
    return _send(procs, ("pull", 0, name), None, label=f"pull {name!r}")


def _send(procs: ProcMesh, meta: tuple, payload: Any, *, label: str) -> Future[Any]:
    group = procs._group
    shape: Shape = procs.shape
    call = PendingCall(group.controller.next_call_id(), shape, actor=label, endpoint="")
    failure = group.failure_for(shape.ranks)
    if failure is not None:
        call.fail(failure)
        return call.future
    meta = (meta[0], call.call_id, *meta[2:])
    group.controller.send(group, shape.ranks, group.signer.encode(meta, payload), call)
    return call.future


# -- worker side ------------------------------------------------------------------------


class RankNamespace:
    """The persistent globals of cells on one rank."""

    def __init__(self, worker: Worker) -> None:
        point = worker.shape.point_of_rank(worker.rank)
        self.context = Context(point, len(worker.shape), worker.mesh_name)
        self.globals: dict[str, Any] = {
            "__name__": "__main__",
            "rank": worker.rank,
            "world_size": len(worker.shape),
            "local_rank": int(os.environ.get("LOCAL_RANK", worker.rank)),
            "point": point,
        }

    def execute(self, filename: str, source: str) -> Any:
        cache_source(filename, source)
        body, expr = compile_cell(source, filename)
        exec(body, self.globals)
        if expr is not None:
            return eval(expr, self.globals)
        return None

    def pull(self, name: str) -> Any:
        try:
            return self.globals[name]
        except KeyError:
            raise NameError(f"name {name!r} is not defined on this rank") from None
