"""Public names read ``monarch_nb.X`` in tracebacks and reprs, not ``monarch_nb._model._x.X``.

The one table of public names is ``_DEFINED_IN`` in ``monarch_nb/__init__``;
each module that defines some ends with ``publish(globals())``, which renames
exactly those. Done at definition, not on first access, because errors show
up in tracebacks before anyone touched ``monarch_nb.X``.
"""

from __future__ import annotations

import sys
from typing import Any


def publish(namespace: dict[str, Any]) -> None:
    package = sys.modules["monarch_nb"]
    defined_in: dict[str, str] = package._DEFINED_IN
    module = namespace["__name__"]
    for name, home in defined_in.items():
        if f"monarch_nb.{home}" == module:
            namespace[name].__module__ = "monarch_nb"


def rename(namespace: dict[str, Any], names: list[str], module: str) -> None:
    """Name ``names`` of ``namespace`` as members of the public ``module`` (a facade
    such as ``monarch_nb.events``), unless they are top-level public names already."""
    for name in names:
        if namespace[name].__module__ != "monarch_nb":
            namespace[name].__module__ = module
