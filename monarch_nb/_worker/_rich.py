"""Rich output from a rank's cells: matplotlib figures and IPython's ``display()``.

A rank has no IPython shell, so two things a notebook user expects need help:

- **matplotlib**: ranks default to the backend in :mod:`._mpl_backend`
  (``MPLBACKEND`` or ``matplotlib.use`` choose another): ``plt.show()`` sends
  every open figure to the cell as PNG and closes it, and at the end of a
  cell the figures still open are sent too, as IPython's inline backend does.
  A figure as a cell's last expression is shown, not sent back as a value.
- **IPython.display.display** called by any library (outside a shell it
  would print a repr) sends the object's rich representation to the cell,
  as the cell's own ``display()`` does. Installed when IPython is imported,
  so a rank that never uses it never imports it.

Nothing here imports matplotlib or IPython: they are patched when user code
imports them.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable
from typing import Any, Protocol

BACKEND = "module://monarch_nb._worker._mpl_backend"
_DISPLAY_MODULE = "IPython.core.display_functions"


class Sink(Protocol):
    """Where rich output goes: the rank's namespace (see ``_namespace``)."""

    def display(self, *objs: Any, metadata: dict[str, Any] | None = None) -> None: ...

    def publish(self, data: dict[str, Any], metadata: dict[str, Any] | None = None) -> None: ...


_sink: Sink | None = None


def sink() -> Sink | None:
    return _sink


def install(target: Sink) -> None:
    """Route figures and IPython displays of this process to ``target``."""
    global _sink
    _sink = target
    # A kernel sets its inline backend in the environment the ranks inherit; it
    # needs the kernel's shell, which a rank does not have.
    chosen = os.environ.get("MPLBACKEND", "")
    if not chosen or chosen.endswith("backend_inline"):
        os.environ["MPLBACKEND"] = BACKEND
    matplotlib = sys.modules.get("matplotlib")
    if matplotlib is not None and matplotlib.get_backend().lower().endswith(("agg", "inline")):
        matplotlib.use(BACKEND)  # imported before the first cell, by an actor
    when_imported(_DISPLAY_MODULE, _patch_display)


def when_imported(name: str, patch: Callable[[Any], None]) -> None:
    """Call ``patch(module)`` on module ``name`` now if it is loaded, or as it loads
    (so ``from package import name`` done later gets the patched object)."""
    module = sys.modules.get(name)
    if module is not None:
        patch(module)
        return
    _PATCHES[name] = patch
    if not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


def open_figures() -> list[Any]:
    """pyplot's open figures, oldest first (none if pyplot was never imported)."""
    if "matplotlib.pyplot" not in sys.modules:
        return []
    from matplotlib._pylab_helpers import Gcf

    return [manager.canvas.figure for manager in Gcf.get_all_fig_managers()]


def show_figures() -> None:
    """Send every open pyplot figure to the cell and close it (``plt.show()``)."""
    figures = open_figures()
    target = _sink
    if not figures or target is None:
        return
    import matplotlib.pyplot as plt

    try:
        for figure in figures:
            target.display(figure)
    finally:
        for figure in figures:
            plt.close(figure)


def after_cell(value: Any) -> Any:
    """At the end of a cell: show the figures left open; a figure as the cell's value
    is shown (once) instead of returned."""
    shown = open_figures()
    if _uses_our_backend():
        show_figures()
    else:
        shown = []
    if _is_figure(value):
        if value not in shown and _sink is not None:
            _sink.display(value)
        return None
    return value


def _uses_our_backend() -> bool:
    matplotlib = sys.modules.get("matplotlib")
    return matplotlib is not None and matplotlib.get_backend() == BACKEND


def _is_figure(value: Any) -> bool:
    kind = type(value)
    return kind.__module__.startswith("matplotlib") and kind.__name__ == "Figure"


def _patch_display(module: Any) -> None:
    original = module.display
    if getattr(original, "_monarch_nb", False):
        return

    @functools.wraps(original)
    def display(*objs: Any, **kwargs: Any) -> Any:
        from IPython.core.interactiveshell import InteractiveShell

        target = _sink
        if target is None or InteractiveShell.initialized():
            return original(*objs, **kwargs)
        metadata = kwargs.get("metadata")
        for obj in objs:
            if kwargs.get("raw"):
                target.publish(dict(obj), metadata)
            else:
                target.display(obj, metadata=metadata)
        return None

    display._monarch_nb = True  # type: ignore[attr-defined]
    module.display = display


# Module name -> the patch to apply as it loads (see when_imported).
_PATCHES: dict[str, Callable[[Any], None]] = {}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches modules of ``_PATCHES`` as they load: e.g. ``IPython.display``
    re-exports ``display`` from ``IPython.core.display_functions``, so that one is
    patched before anything can import it."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader, patch)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, patch: Callable[[Any], None]) -> None:
        self.loader = loader
        self.patch = patch

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        self.patch(module)
