"""The persistent namespace ``%%mesh`` cells run in on one rank, and rich display.

Each rank keeps one namespace (per process mesh), with ``rank``,
``world_size``, ``local_rank``, ``point`` and ``display`` predefined
(``display(obj)`` sends the object's rich representation to the notebook,
tagged with the rank). Top-level ``await`` works in cells; the value of a
trailing expression is returned, like IPython's ``Out``. Matplotlib figures
and ``IPython.display.display`` from any library reach the notebook too
(see :mod:`._rich`).
"""

from __future__ import annotations

import base64
import inspect
import io
import os
from collections.abc import Callable
from typing import Any, Protocol

from .._model._shape import Shape
from .._runtime._cell_source import CO_COROUTINE, cache_source, compile_cell
from .._runtime._context import Context
from .._wire._messages import Display, Message
from . import _comms, _rich


class Worker(Protocol):
    """The worker, as a namespace names it: where the rank sits in its mesh (a
    resize changes it), and how to reach the controller (comms use ``wire`` and
    ``post`` too)."""

    rank: int
    shape: Shape
    mesh_name: str
    wire: Any

    def send(self, message: Message, payload: Any = None) -> None: ...

    def post(self, task: Callable[[], None]) -> None: ...


class RankNamespace:
    """The persistent globals of cells on one rank."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.globals: dict[str, Any] = {"__name__": "__main__", "display": self.display}
        self.renumber()
        _rich.install(self)
        _comms.install(worker)  # ipywidgets made in cells reach the notebook

    def renumber(self) -> None:
        """Take the worker's rank and shape (at start, and after a resize)."""
        worker = self.worker
        point = worker.shape.point_of_rank(worker.rank)
        self.context = Context(point, len(worker.shape), worker.mesh_name)
        self.globals.update(
            rank=worker.rank,
            world_size=len(worker.shape),
            local_rank=int(os.environ.get("LOCAL_RANK", worker.rank)),
            point=point,
        )

    def execute(self, filename: str, source: str) -> Any:
        """Run a cell; the trailing expression's value, or a coroutine if it awaits."""
        cache_source(filename, source)
        body, expr = compile_cell(source, filename)
        if (body.co_flags | (expr.co_flags if expr else 0)) & CO_COROUTINE:
            return self._execute_async(body, expr)
        value = None
        try:
            exec(body, self.globals)
            if expr is not None:
                value = eval(expr, self.globals)
        finally:
            value = _rich.after_cell(value)  # figures left open are shown, as inline does
        return value

    async def _execute_async(self, body: Any, expr: Any) -> Any:
        value = None
        try:
            result = eval(body, self.globals)
            if inspect.iscoroutine(result):
                await result
            if expr is not None:
                value = eval(expr, self.globals)
                if expr.co_flags & CO_COROUTINE:
                    value = await value
        finally:
            value = _rich.after_cell(value)
        return value

    def display(self, *objs: Any, metadata: dict[str, Any] | None = None) -> None:
        """Show ``objs`` in the notebook cell running this code, tagged with this rank.

        Uses the objects' rich representations (``_repr_html_``, ``_repr_png_``,
        ``_repr_mimebundle_``, a matplotlib figure as PNG); text elsewhere.
        """
        for obj in objs:
            data, md = mime_bundle(obj)
            md.update(metadata or {})
            self.worker.send(Display(), {"data": data, "metadata": md})

    def publish(self, data: dict[str, Any], metadata: dict[str, Any] | None = None) -> None:
        """Send a ready mime bundle (``IPython.display.display(..., raw=True)``)."""
        bundle = {k: v for k, v in data.items() if isinstance(v, str | dict | list)}
        bundle.setdefault("text/plain", "<display>")
        self.worker.send(Display(), {"data": bundle, "metadata": dict(metadata or {})})

    def pull(self, name: str) -> Any:
        try:
            return self.globals[name]
        except KeyError:
            raise NameError(f"name {name!r} is not defined on this rank") from None


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
