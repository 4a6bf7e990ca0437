"""The notebook side of monarch_nb: ``%mesh`` / ``%%mesh`` and the objects behind them.

``%load_ext monarch_nb`` (or ``monarch_nb.magics``) registers the magics.
Importing this package does not import IPython; the registry of notebook
meshes (:func:`current_mesh`, :func:`start_mesh`) works from plain Python.
"""

from __future__ import annotations

from typing import Any

from ._registry import CellHandle, NotebookMesh, current_mesh, start_mesh

__all__ = [
    "CellHandle",
    "NotebookMesh",
    "current_mesh",
    "load_ipython_extension",
    "start_mesh",
    "unload_ipython_extension",
]


def load_ipython_extension(shell: Any) -> None:
    """Register ``%mesh`` and ``%%mesh`` (IPython calls this on ``%load_ext``)."""
    from ._extension import load_ipython_extension as load

    load(shell)


def unload_ipython_extension(shell: Any) -> None:
    """Stop every mesh and remove the magics (``%unload_ext``)."""
    from ._extension import unload_ipython_extension as unload

    unload(shell)
