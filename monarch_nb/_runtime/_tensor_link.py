"""The core's one way into the tensor engine, which sits above it.

``ProcMesh.activate()``, ``PeerProcMesh.activate()`` and ``endpoint.rref()``
live in the core but run the tensor engine (the ``tensor`` package, which
imports torch). The core does not import it: the package's top
(``monarch_nb/__init__.py``, loaded first in every process) installs the loader
here, and the engine loads on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_loader: Callable[[str], Any] | None = None


def install(loader: Callable[[str], Any]) -> None:
    """``loader("._actors")`` returns that module of the tensor engine."""
    global _loader
    _loader = loader


def tensor_engine(module: str = "") -> Any:
    """The tensor engine's package (or its submodule ``module``, e.g. ``"._actors"``)."""
    if _loader is None:  # only if monarch_nb/__init__ did not run: never in practice
        raise RuntimeError("the tensor engine is not installed: import monarch_nb first")
    return _loader(module)
