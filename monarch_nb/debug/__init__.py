"""The pdb bridge: ``breakpoint()`` on a rank opens a ``(Pdb rank N)`` prompt here.

Layering: this package sits beside ``magics/`` on top of the runtime; the
runtime never imports it. It plugs in through three generic core hooks, all
set by :func:`install`:

runtime never imports it. It plugs in through three generic core hooks:

- ``_process_group.WORKER_IMPORTS`` (by default): every worker imports
  :mod:`._hook` and calls its ``install_on_worker`` (breakpoint hook,
  ``pdb.set_trace``, and a wire-thread handler for ``DebugInput``);
- ``_process_group.DEBUGGER_FOR``: a group whose rank pauses gets a
  :class:`~._session.DebugSession` following its Debugger* events. By
  default (``DEFAULT_DEBUGGER``, :mod:`._script`) a thread of the controller
  serves it: on the terminal if stdin is one, otherwise to ``monarch-nb
  debug`` attached from another terminal (:mod:`._attach`);
- ``_calls.set_wait_hook`` (set by :func:`install`, which a notebook's
  ``%load_ext monarch_nb`` calls): a thread blocked in ``CallFuture.get`` (a
  ``%%mesh`` cell, ``endpoint.call().get()``, ``procs.run``) serves the
  prompt (:mod:`._prompt`): in a kernel only that thread may ask for input.

Modules::

    _hook       worker side, loaded by every rank: breakpoint(), the lazy pdb
    _remote     worker side, at the first pause: RemotePdb, post_mortem()
    _commands   parser of the mesh commands (ranks, attach, cast, continue all, help)
    _session    controller side: which ranks are paused where, their output
    _prompt     controller side: the prompt loop and the wait hook
    _script     controller side without install(): the serving thread
    _attach     its socket for ``monarch-nb debug``, and that client
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._hook import breakpoint

if TYPE_CHECKING:
    from .._controller._proc_mesh import ProcMesh

_HOOK = "monarch_nb.debug._hook"
_REMOTE = "monarch_nb.debug._remote"


def install() -> None:
    """Serve breakpoints at the prompt of the thread that waits for the call (a
    notebook cell's input request; a script's stdin, a pipe included).

    Without it a script's breakpoints are served all the same, by a thread of
    its own: on its terminal, or to ``monarch-nb debug``."""
    from .._controller import _calls, _process_group
    from ._prompt import wait_hook
    from ._session import session_for

    if _HOOK not in _process_group.WORKER_IMPORTS:
        _process_group.WORKER_IMPORTS.append(_HOOK)
    _process_group.DEBUGGER_FOR = session_for
    _calls.set_wait_hook(wait_hook)


def uninstall() -> None:
    """Undo :func:`install`: breakpoints are served as in a script that did not
    call it (PYTHONBREAKPOINT=0 turns them off)."""
    from .._controller import _calls, _process_group

    _process_group.DEBUGGER_FOR = None
    _calls.set_wait_hook(None)


def post_mortem(procs: ProcMesh, rank: int | None = None, *, timeout: float | None = None) -> Any:
    """pdb at the frame where ``rank``'s last failed cell or endpoint call raised.

    ``rank`` defaults to the lowest rank of ``procs`` whose last call failed.
    Blocks, serving the prompt, until the user continues or quits.
    """
    from .._controller._cells import run_cell
    from .._controller._interrupt import wait_for
    from .._model._errors import MeshUsageError

    group = procs._group
    if rank is None:
        failed = sorted(r for r in group.rank_failures if r in procs.shape.ranks)
        if not failed:
            raise MeshUsageError(
                f"no rank of mesh {procs.name!r} has a failed call to debug; "
                "give the rank explicitly (%mesh debug --rank R)"
            )
        rank = failed[0]
    if rank not in procs.shape.ranks:
        raise MeshUsageError(
            f"rank {rank!r} is not in mesh {procs.name!r} (ranks {list(procs.shape.ranks)})"
        )
    view = procs.slice(**dict(procs.shape.point_of_rank(rank)))
    source = f"__import__({_REMOTE!r}, fromlist=['_']).post_mortem()"
    # A post-mortem is not a step of the mesh's history (restart(replay=True)).
    wait_for(run_cell(view, source, name="<mesh-debug>", record=False), timeout=timeout)


__all__ = ["breakpoint", "install", "post_mortem", "uninstall"]
