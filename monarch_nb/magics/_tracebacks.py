"""Remote errors as IPython shows its own: its colours, the notebook's words.

A rank's traceback arrives as text (the frames are in another process), so
it is coloured here line by line with the shell's active colour scheme
(``%colors`` applies; ``NoColor`` gives plain text): the heading as IPython
draws one, frames' file, line and function, and each exception's name. Cell
names read as the notebook numbers them (``%%mesh cell [3]``), and hints
name the magic (``%mesh restart``, see :func:`restart_hint`).
"""

from __future__ import annotations

import re
from typing import Any

from .._common._errors import MeshUsageError
from ._registry import REGISTRY

_RULE = "-" * 75
_FRAME = re.compile(r'^(\s*)File "(.+)", line (\d+), in (.+)$')
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*)(:.*)?$")
_CELL = re.compile(r"(?:%%mesh )?cell <mesh-cell-([\d.]+)>")


def restart_hint(mesh: str) -> str | None:
    """``run %mesh restart`` (with ``--mesh`` unless it is the default) for a mesh this
    notebook started; None for another (the runtime then names the method)."""
    try:
        started = REGISTRY.get(mesh)
    except MeshUsageError:
        return None
    default = REGISTRY.default is started
    return "run %mesh restart" + ("" if default else f" --mesh {mesh}")


def notebook_words(line: str) -> str:
    """``%%mesh cell <mesh-cell-3>`` -> ``%%mesh cell [3]`` (not in frames' file names)."""
    return _CELL.sub(lambda m: f"%%mesh cell [{m.group(1)}]", line)


class IPythonStyle:
    """``style(error, lines)`` for :func:`~.._common._errors.set_ipython_style`."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell

    def colours(self) -> dict[str, str]:
        try:
            return dict(self.shell.InteractiveTB.Colors)
        except Exception:  # another IPython's scheme table: plain text is still right
            return {}

    def __call__(self, error: BaseException, lines: list[str]) -> list[str]:
        c = self.colours()
        top, exc, normal = c.get("topline", ""), c.get("excName", ""), c.get("Normal", "")
        name = type(error).__name__
        first, *rest = lines or [""]
        first = notebook_words(first.removeprefix(f"{name}: "))
        out = [f"{top}{_RULE}{normal}", f"{exc}{name}{normal}: {first}"]
        in_traceback = False
        for line in rest:
            if line.startswith("Traceback (most recent call last)"):
                in_traceback = True
                out.append(line)
                continue
            frame = _FRAME.match(line)
            if in_traceback and frame:
                indent, path, number, function = frame.groups()
                out.append(
                    f'{indent}File {c.get("filenameEm", "")}"{path}"{normal}, line '
                    f"{c.get('linenoEm', '')}{number}{normal}, in "
                    f"{c.get('nameEm', '')}{function}{normal}"
                )
                continue
            exception = _EXCEPTION.match(line) if in_traceback and line[:1].strip() else None
            if exception:
                in_traceback = False
                out.append(f"{exc}{exception.group(1)}{normal}{exception.group(2) or ''}")
            elif line.startswith("--- "):
                out.append(f"{top}{notebook_words(line)}{normal}")
            elif not in_traceback:
                out.append(notebook_words(line))
            else:
                out.append(line)
        return out
