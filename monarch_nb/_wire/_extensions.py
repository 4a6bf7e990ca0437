"""The optional C extensions of :mod:`monarch_nb._wire`, loaded by name.

Each has a Python path giving the same bytes, so a build without a C compiler
still works; ``MONARCH_NB_PURE_PYTHON_WIRE=1`` turns them all off, so the
tests can run meshes that mix both ways. Its own module: pickling needs it
too, and must not import the socket layer (nor zmq) to get it.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def load_extension(name: str) -> ModuleType | None:
    """``monarch_nb._wire.<name>``, or None: not built (no C compiler at install
    time) or turned off (``MONARCH_NB_PURE_PYTHON_WIRE``)."""
    if os.environ.get("MONARCH_NB_PURE_PYTHON_WIRE", "") not in ("", "0"):
        return None
    try:
        return importlib.import_module(f"{__package__}.{name}")
    except ImportError:
        return None
