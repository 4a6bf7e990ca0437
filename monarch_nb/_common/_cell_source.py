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
from typing import Any

# Top-level ``await`` compiles to a code object that returns a coroutine.
CELL_FLAGS = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
CO_COROUTINE = inspect.CO_COROUTINE

_cell_numbers = itertools.count(1)


def next_cell_name() -> tuple[int, str]:
    """``(n, "<mesh-cell-n>")``: the one counter that numbers cells in this process."""
    number = next(_cell_numbers)
    return number, f"<mesh-cell-{number}>"


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
