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

from .._model._errors import MeshUsageError
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


# The parts of a traceback we colour, by their names in IPython 8's colour
# schemes (``InteractiveTB.Colors``) and the tokens IPython 9's themes style.
_PARTS = ("topline", "excName", "filenameEm", "linenoEm", "nameEm")
_TOKENS = {
    "topline": ("Topline",),
    "excName": ("ExcName",),
    "filenameEm": ("FilenameEm",),
    "linenoEm": ("LinenoEm",),
    "nameEm": ("TB", "NameEm"),
}


def _scheme_colours(shell: Any) -> dict[str, tuple[str, str]]:
    """IPython 8: each part's start code from the active scheme, ended by ``Normal``."""
    table = dict(shell.InteractiveTB.Colors)
    normal = table.get("Normal", "")
    return {part: (table.get(part, ""), normal) for part in _PARTS}


def _theme_colours(shell: Any) -> dict[str, tuple[str, str]]:
    """IPython 9: each part's codes from the theme ``%colors`` chose (``shell.colors``),
    as the theme formats that part's token around a marker."""
    from IPython.utils.PyColorize import theme_table
    from pygments.token import Token

    theme = theme_table[str(shell.colors).lower()]
    colours = {}
    for part, path in _TOKENS.items():
        token = Token
        for name in path:
            token = getattr(token, name)
        start, _, end = theme.format([(token, "\0")]).partition("\0")
        colours[part] = (start, end)
    return colours


def colours(shell: Any) -> dict[str, tuple[str, str]]:
    """``{part: (start, end)}`` escape codes of the shell's active colours, on the
    IPython releases we support; empty (plain text, still right) for one we do not."""
    for read in (_theme_colours, _scheme_colours):
        try:
            return read(shell)
        except Exception:  # not this release's way: try the other
            continue
    return {}


class IPythonStyle:
    """``style(error, lines)`` for :func:`~.._model._errors.set_ipython_style`."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell

    def __call__(self, error: BaseException, lines: list[str]) -> list[str]:
        codes = colours(self.shell)

        def paint(part: str, text: str) -> str:
            start, end = codes.get(part, ("", ""))
            return f"{start}{text}{end}"

        name = type(error).__name__
        first, *rest = lines or [""]
        first = notebook_words(first.removeprefix(f"{name}: "))
        out = [paint("topline", _RULE), f"{paint('excName', name)}: {first}"]
        in_traceback = False
        for line in rest:
            if line.startswith("Traceback (most recent call last)"):
                in_traceback = True
                out.append(line)
                continue
            frame = _FRAME.match(line)
            if in_traceback and frame:
                indent, path, number, function = frame.groups()
                quoted = f'"{path}"'
                out.append(
                    f"{indent}File {paint('filenameEm', quoted)}, line "
                    f"{paint('linenoEm', number)}, in {paint('nameEm', function)}"
                )
                continue
            exception = _EXCEPTION.match(line) if in_traceback and line[:1].strip() else None
            if exception:
                in_traceback = False
                out.append(paint("excName", exception.group(1)) + (exception.group(2) or ""))
            elif line.startswith("--- "):
                out.append(paint("topline", notebook_words(line)))
            elif not in_traceback:
                out.append(notebook_words(line))
            else:
                out.append(line)
        return out
