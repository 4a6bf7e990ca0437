"""Cell source shared by both sides: compiled on the controller, run on ranks.

A cell is compiled on the controller first (a SyntaxError never reaches a
worker), then registered in ``linecache`` on both sides under one name, so
remote tracebacks show the cell's own source lines.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import linecache
import threading
from typing import Any

# Top-level ``await`` compiles to a code object that returns a coroutine.
CELL_FLAGS = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
CO_COROUTINE = inspect.CO_COROUTINE

_cell_numbers = itertools.count(1)
_names_used: set[str] = set()
_names_lock = threading.Lock()


def next_cell_name(number: int | None = None) -> tuple[int, str]:
    """``(n, "<mesh-cell-n>")``: a name no other cell of this process has.

    ``number`` is the notebook's execution count, so ``In [5]`` runs as
    ``<mesh-cell-5>``; a second cell under the same number (two runs in one
    notebook cell) is ``<mesh-cell-5.2>``. Without it, a process-wide counter.
    """
    with _names_lock:
        if number is None:
            number = next(_cell_numbers)
        name, again = f"<mesh-cell-{number}>", 1
        while name in _names_used:
            again += 1
            name = f"<mesh-cell-{number}.{again}>"
        _names_used.add(name)
    return number, name


def cache_source(filename: str, source: str) -> None:
    """Make ``source`` visible to tracebacks under ``filename``."""
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)


def compile_cell(source: str, filename: str) -> tuple[Any, Any]:
    """Compile a cell as (body, trailing expression or None); raises SyntaxError."""
    tree = ast.parse(source, filename=filename, mode="exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        trailing = tree.body.pop()
        assert isinstance(trailing, ast.Expr)
        last = ast.Expression(trailing.value)
    body = compile(tree, filename, "exec", flags=CELL_FLAGS)
    expr = compile(last, filename, "eval", flags=CELL_FLAGS) if last is not None else None
    return body, expr
