"""Running code cells on ranks: the runtime side of ``%%mesh``.

Each rank keeps one persistent namespace (per process mesh), with ``rank``,
``world_size``, ``local_rank``, ``point`` and ``display`` predefined
(``display(obj)`` sends the object's rich representation to the notebook,
tagged with the rank). Top-level ``await`` works in cells. A cell is compiled on
the controller first (a SyntaxError never reaches a worker), registered in
``linecache`` on both sides under one name so remote tracebacks show the
cell's source lines, then executed; the value of a trailing expression is
returned, like IPython's ``Out``.

Nothing here imports IPython: magics/ translates between this and a notebook.
"""

from __future__ import annotations

import ast
import base64
import inspect
import io
import linecache
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._calls import PendingCall
from ._context import Context
from ._errors import CellError
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


# Top-level ``await`` compiles to a code object that returns a coroutine.
_CELL_FLAGS = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
_CO_COROUTINE = inspect.CO_COROUTINE


def compile_cell(source: str, filename: str) -> tuple[Any, Any]:
    """Compile a cell as (body, trailing expression or None); raises SyntaxError."""
    tree = ast.parse(source, filename=filename, mode="exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    body = compile(tree, filename, "exec", flags=_CELL_FLAGS)
    expr = compile(last, filename, "eval", flags=_CELL_FLAGS) if last is not None else None
    return body, expr


# -- controller side ------------------------------------------------------------------


def run_cell(procs: ProcMesh, source: str, *, name: str | None = None) -> Future[Any]:
    """Run ``source`` on every rank of ``procs``; a future of the last expression's values.

    Raises SyntaxError at once (locally) if the cell does not compile.
    """
    filename = name or f"<mesh-cell-{next(_cell_counter)}>"
    compile_cell(source, filename)  # SyntaxError here, before anything is sent
    cache_source(filename, source)
    return _send(procs, ("exec", 0, filename), source, label=f"cell {filename}", cell=True)


def push(procs: ProcMesh, values: Mapping[str, Any]) -> Future[Any]:
    """Set names in every rank's namespace (the values are pickled once)."""
    return _send(procs, ("push", 0), dict(values), label="push")


def pull(procs: ProcMesh, name: str) -> Future[Any]:
    """A future of a ValueMesh of ``name`` in every rank's namespace."""
    return _send(procs, ("pull", 0, name), None, label=f"pull {name!r}")


def _send(
    procs: ProcMesh, meta: tuple, payload: Any, *, label: str, cell: bool = False
) -> Future[Any]:
    group = procs._group
    shape: Shape = procs.shape
    call = PendingCall(
        group.controller.next_call_id(),
        shape,
        actor=label,
        endpoint="",
        error_class=CellError if cell else None,
    )
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
        self.worker = worker
        self.context = Context(point, len(worker.shape), worker.mesh_name)
        self.globals: dict[str, Any] = {
            "__name__": "__main__",
            "rank": worker.rank,
            "world_size": len(worker.shape),
            "local_rank": int(os.environ.get("LOCAL_RANK", worker.rank)),
            "point": point,
            "display": self.display,
        }

    def execute(self, filename: str, source: str) -> Any:
        """Run a cell; the trailing expression's value, or a coroutine if it awaits."""
        cache_source(filename, source)
        body, expr = compile_cell(source, filename)
        if (body.co_flags | (expr.co_flags if expr else 0)) & _CO_COROUTINE:
            return self._execute_async(body, expr)
        exec(body, self.globals)
        if expr is not None:
            return eval(expr, self.globals)
        return None

    async def _execute_async(self, body: Any, expr: Any) -> Any:
        result = eval(body, self.globals)
        if inspect.iscoroutine(result):
            await result
        if expr is None:
            return None
        value = eval(expr, self.globals)
        return await value if expr.co_flags & _CO_COROUTINE else value

    def display(self, *objs: Any, metadata: dict[str, Any] | None = None) -> None:
        """Show ``objs`` in the notebook cell running this code, tagged with this rank.

        Uses the objects' rich representations (``_repr_html_``, ``_repr_png_``,
        ``_repr_mimebundle_``, a matplotlib figure as PNG); text elsewhere.
        """
        for obj in objs:
            data, md = mime_bundle(obj)
            md.update(metadata or {})
            self.worker.send_event("display", {"data": data, "metadata": md})

    def pull(self, name: str) -> Any:
        try:
            return self.globals[name]
        except KeyError:
            raise NameError(f"name {name!r} is not defined on this rank") from None


# -- rich display on a rank -------------------------------------------------------------

_REPR_METHODS = (
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("text/latex", "_repr_latex_"),
    ("application/json", "_repr_json_"),
)


def mime_bundle(obj: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(data, metadata) for ``obj``, JSON-clean, without importing IPython on the rank."""
    data: dict[str, Any] = {}
    metadata: dict[str, Any] = {}
    method = getattr(obj, "_repr_mimebundle_", None)
    if callable(method) and not isinstance(obj, type):
        got = method()
        if isinstance(got, tuple):
            got, metadata = got[0], dict(got[1] or {})
        data.update(got or {})
    for mime, name in _REPR_METHODS:
        if mime in data:
            continue
        method = getattr(obj, name, None)
        if not callable(method) or isinstance(obj, type):
            continue
        value = method()
        if isinstance(value, tuple):
            value, metadata[mime] = value
        if value is not None:
            data[mime] = value
    if type(obj).__module__.startswith("matplotlib") and hasattr(obj, "savefig"):
        buffer = io.BytesIO()
        obj.savefig(buffer, format="png", bbox_inches="tight")
        data["image/png"] = buffer.getvalue()
    for mime in ("image/png", "image/jpeg"):
        if isinstance(data.get(mime), bytes):
            data[mime] = base64.b64encode(data[mime]).decode("ascii")
    data.setdefault("text/plain", repr(obj))
    return data, metadata
