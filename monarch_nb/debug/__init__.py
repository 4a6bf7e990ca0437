"""The pdb bridge: ``breakpoint()`` on a rank opens a ``(Pdb rank N)`` prompt here.

Layering: this package sits beside ``magics/`` on top of the runtime; the
runtime never imports it. It plugs in through three generic core hooks, all
set by :func:`install`:

- ``_process_group.WORKER_IMPORTS``: workers started afterwards import
  :mod:`._remote` and call its ``install_on_worker`` (breakpoint hook,
  ``pdb.set_trace``, and a wire-thread handler for ``DebugInput``);
- ``_process_group.DEBUGGER_FOR``: a group whose rank pauses gets a
  :class:`~._session.DebugSession` following its Debugger* events;
- ``_calls.set_wait_hook``: a thread blocked in ``CallFuture.get`` (a
  ``%%mesh`` cell, ``endpoint.call().get()``, ``procs.run``) serves the
  prompt (:mod:`._prompt`).

Modules::

    _remote     worker side: RemotePdb, breakpoint(), post_mortem()
    _commands   parser of the mesh commands (ranks, attach, cast, continue all, help)
    _session    controller side: which ranks are paused where, their output
    _prompt     controller side: the prompt loop and the wait hook

In a notebook ``%load_ext monarch_nb`` installs it; a script calls
``monarch_nb.debug.install()`` before ``spawn_procs()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._remote import breakpoint

if TYPE_CHECKING:
    from .._controller._proc_mesh import ProcMesh

_REMOTE = "monarch_nb.debug._remote"


def install() -> None:
    """Serve breakpoints of ranks started from now on at this process's prompt."""
    from .._controller import _calls, _process_group
    from ._prompt import wait_hook
    from ._session import session_for

    if _REMOTE not in _process_group.WORKER_IMPORTS:
        _process_group.WORKER_IMPORTS.append(_REMOTE)
    _process_group.DEBUGGER_FOR = session_for
    _calls.set_wait_hook(wait_hook)


def uninstall() -> None:
    """Undo :func:`install` (ranks already started keep their breakpoint hook;
    their breakpoints then raise, naming what to do)."""
    from .._controller import _calls, _process_group

    if _REMOTE in _process_group.WORKER_IMPORTS:
        _process_group.WORKER_IMPORTS.remove(_REMOTE)
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
