"""``%mesh on``: plain cells run on the mesh, through an input transformer.

IPython applies ``input_transformers_post`` after its own transforms, so by
then ``%magics``, ``!shell`` and ``x?`` have become ``get_ipython()...``
calls: such cells keep running here (that is how ``%mesh off`` still works).
Every other cell is rewritten into a ``%%mesh`` call with its source. We do
not replace ``run_cell``: history, ``In``/``Out`` and other extensions see an
ordinary cell.
"""

from __future__ import annotations


class AutoRun:
    """The input transformer; ``options`` is the ``%%mesh`` option line to use."""

    def __init__(self, options: str) -> None:
        self.options = options

    def __call__(self, lines: list[str]) -> list[str]:
        source = "".join(lines)
        if not source.strip() or source.lstrip().startswith("get_ipython()"):
            return lines
        line = f"--auto {self.options}".strip()
        return [f"get_ipython().run_cell_magic('mesh', {line!r}, {source!r})\n"]
