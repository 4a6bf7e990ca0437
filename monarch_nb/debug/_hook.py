"""What every rank loads at start so that ``breakpoint()`` reaches the controller.

The core names this module in ``_process_group.WORKER_IMPORTS``: each worker
imports it and calls :func:`install_on_worker` before user code runs. It is
kept light (no ``pdb``: a few milliseconds of every rank's start, for the rare
rank that pauses): the pdb bridge (:mod:`._remote`) is imported at the first
``breakpoint()`` or ``import pdb`` on the rank.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import queue
import sys
from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import Any

from .._wire._messages import DebugInput, DebugRefused, Message

_worker: Any = None  # the rank's Worker, once installed
# Lines for pdb, handed over by the wire thread while the main thread waits in pdb.
lines: queue.SimpleQueue[DebugInput | DebugRefused] = queue.SimpleQueue()


def worker() -> Any:
    return _worker


def _on_line(message: Message) -> None:
    lines.put(message)  # type: ignore[arg-type]  # registered for these two types only


def _remote() -> Any:
    # By name: _remote imports this module (the rank's state lives here), and is
    # imported only when a rank first pauses.
    return importlib.import_module(f"{__package__}._remote")


def _sys_breakpointhook(*args: Any, **kwargs: Any) -> None:
    _remote().RemotePdb(_worker.rank).set_trace(sys._getframe().f_back)


def breakpoint(*, ranks: Iterable[int] | None = None) -> None:
    """Pause the calling code in the debugger, on ``ranks`` only (default: every rank).

    On a rank, opens the ``(Pdb rank N)`` prompt where the controller waits (a
    notebook cell, the script's terminal, or ``monarch-nb debug``); the other
    ranks run on. On the controller itself, the ordinary ``pdb``.
    """
    frame = sys._getframe().f_back
    if _worker is None:
        import pdb

        pdb.Pdb().set_trace(frame)
        return
    if ranks is not None and _worker.rank not in set(ranks):
        return
    _remote().RemotePdb(_worker.rank).set_trace(frame)


def set_trace(*, header: str | None = None) -> None:
    """``pdb.set_trace()`` on a rank (it replaces it there): pause the caller until the
    controller's prompt continues it."""
    debugger = _remote().RemotePdb(_worker.rank)
    if header is not None:
        debugger.message(header)
    debugger.set_trace(sys._getframe().f_back)


class _PatchPdbOnImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import pdb`` on the rank gets a pdb whose ``set_trace`` is the remote one,
    without importing pdb at every rank's start."""

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != "pdb":
            return None
        sys.meta_path.remove(self)  # find the real one, once
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        module.set_trace = set_trace  # type: ignore[attr-defined]


def install_on_worker(worker: Any) -> None:
    """Make ``breakpoint()`` and ``pdb.set_trace()`` on this rank use the controller's prompt."""
    global _worker
    _worker = worker
    worker.wire.control_handlers[DebugInput] = _on_line
    worker.wire.control_handlers[DebugRefused] = _on_line
    # PYTHONBREAKPOINT=0 still disables breakpoint(), as it does for plain Python.
    if os.environ.get("PYTHONBREAKPOINT") != "0":
        sys.breakpointhook = _sys_breakpointhook
    if "pdb" in sys.modules:
        sys.modules["pdb"].set_trace = set_trace  # type: ignore[attr-defined]
    elif not any(isinstance(f, _PatchPdbOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchPdbOnImport())
