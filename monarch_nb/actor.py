"""Monarch's ``monarch.actor`` import path, for programs written against Monarch.

``from monarch.actor import Actor, endpoint, this_host`` ports as
``from monarch_nb.actor import Actor, endpoint, this_host``. Each name is the
one ``monarch_nb`` itself exports (loaded on first use, as there), except:

- ``ActorError`` is :class:`~monarch_nb.RemoteError`: user code raised in an
  endpoint. It carries the remote traceback as text (``.remote_traceback``,
  ``.failures`` per rank), not Monarch's ``.exception`` object.
- ``unhandled_fault_hook`` is assignable, as in Monarch:
  ``monarch_nb.actor.unhandled_fault_hook = fn`` makes ``fn(failure)`` run for
  every failure of a mesh no actor supervises (see
  :mod:`monarch_nb._controller._supervision`). The default does nothing more
  than monarch_nb always does: the mesh is failed, and its next call or cell
  raises the ``MeshFailure``. Monarch's default exits the process instead.
- ``SupervisionError`` is what a call to an actor that has failed raises (its
  endpoint raised a ``BaseException`` that is not an ``Exception``, its
  process died, its mesh failed), as Monarch's; Monarch exports it from
  ``monarch._rust_bindings.monarch_hyperactor.supervision``. Here it is also a
  ``MeshFailure``.

Names of ``monarch.actor`` not provided here: ``as_endpoint``,
``enable_transport``, ``ChannelTransport``, ``ProcId``, ``Uid``, ``config``,
``debug_controller``, ``hosts_from_config``, ``attach`` (ours,
:func:`monarch_nb.attach`, attaches to running agents with other arguments),
``get_meter``, ``span``, ``traced``. ``run_worker_loop_forever`` and
``attach_to_workers`` take a key file as ``ca`` (``monarch-nb keygen``) and
refuse ``"trust_all_connections"``, saying what to do.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._controller._actor_mesh import ActorMesh, Endpoint
    from ._controller._bootstrap_command import BootstrapCommand, default_bootstrap_cmd
    from ._controller._legacy_spawn import proc_mesh
    from ._controller._proc_mesh import HostMesh, ProcMesh, shutdown_context, this_host
    from ._jobs._worker_loop import attach_to_workers, run_worker_loop_forever
    from ._model._errors import MeshFailure, SupervisionError
    from ._model._errors import RemoteError as ActorError
    from ._model._future import Future
    from ._model._shape import Extent, Point
    from ._model._value_mesh import ValueMesh
    from ._runtime._accumulator import Accumulator
    from ._runtime._actors import Actor, concurrent_endpoint, endpoint
    from ._runtime._context import (
        Context,
        context,
        current_actor_name,
        current_rank,
        current_size,
    )
    from ._runtime._endpoint import send
    from ._runtime._local_actors import this_proc
    from ._runtime._ports import Channel, Port, PortReceiver
    from ._runtime._singletons import get_or_spawn_controller

# Name here -> (private module, name there). Loaded on first use, so a worker
# that imports an actor class written against this module loads no controller code.
_DEFINED_IN = {
    "Accumulator": ("_runtime._accumulator", "Accumulator"),
    "attach_to_workers": ("_jobs._worker_loop", "attach_to_workers"),
    "Actor": ("_runtime._actors", "Actor"),
    "ActorError": ("_model._errors", "RemoteError"),
    "ActorMesh": ("_controller._actor_mesh", "ActorMesh"),
    "BootstrapCommand": ("_controller._bootstrap_command", "BootstrapCommand"),
    "Context": ("_runtime._context", "Context"),
    "Endpoint": ("_controller._actor_mesh", "Endpoint"),
    "Extent": ("_model._shape", "Extent"),
    "Future": ("_model._future", "Future"),
    "HostMesh": ("_controller._proc_mesh", "HostMesh"),
    "MeshFailure": ("_model._errors", "MeshFailure"),
    "SupervisionError": ("_model._errors", "SupervisionError"),
    "Point": ("_model._shape", "Point"),
    "ProcMesh": ("_controller._proc_mesh", "ProcMesh"),
    "ValueMesh": ("_model._value_mesh", "ValueMesh"),
    "context": ("_runtime._context", "context"),
    "current_actor_name": ("_runtime._context", "current_actor_name"),
    "current_rank": ("_runtime._context", "current_rank"),
    "current_size": ("_runtime._context", "current_size"),
    "default_bootstrap_cmd": ("_controller._bootstrap_command", "default_bootstrap_cmd"),
    "endpoint": ("_runtime._actors", "endpoint"),
    "get_or_spawn_controller": ("_runtime._singletons", "get_or_spawn_controller"),
    "proc_mesh": ("_controller._legacy_spawn", "proc_mesh"),
    "run_worker_loop_forever": ("_jobs._worker_loop", "run_worker_loop_forever"),
    "shutdown_context": ("_controller._proc_mesh", "shutdown_context"),
    "this_host": ("_controller._proc_mesh", "this_host"),
    # Actors that talk to actors: ports and channels, this process, send().
    "Channel": ("_runtime._ports", "Channel"),
    "Port": ("_runtime._ports", "Port"),
    "PortReceiver": ("_runtime._ports", "PortReceiver"),
    "concurrent_endpoint": ("_runtime._actors", "concurrent_endpoint"),
    "send": ("_runtime._endpoint", "send"),
    "this_proc": ("_runtime._local_actors", "this_proc"),
}


def __getattr__(name: str) -> Any:
    where = _DEFINED_IN.get(name)
    if where is None:
        raise AttributeError(f"module 'monarch_nb.actor' has no attribute {name!r}")
    module, attribute = where
    value = getattr(importlib.import_module(f"monarch_nb.{module}"), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _ActorModule(types.ModuleType):
    """This module, with ``unhandled_fault_hook`` as a settable attribute."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        # By name, as pickle and cloudpickle take a plain module: a function or class
        # pickled by value (a notebook's) that names monarch_nb.actor.X refers to it,
        # and their tables of module reducers match the type exactly, not a subclass.
        return importlib.import_module, (self.__name__,)

    @property
    def unhandled_fault_hook(self) -> Callable[[MeshFailure], object]:
        """Called with every unhandled ``MeshFailure``; assign to replace it."""
        from ._controller._supervision import get_unhandled_fault_hook

        return get_unhandled_fault_hook()

    @unhandled_fault_hook.setter
    def unhandled_fault_hook(self, hook: Callable[[MeshFailure], object] | None) -> None:
        from ._controller._supervision import set_unhandled_fault_hook

        set_unhandled_fault_hook(hook)


sys.modules[__name__].__class__ = _ActorModule

__all__ = [
    "Accumulator",
    "Actor",
    "ActorError",
    "ActorMesh",
    "BootstrapCommand",
    "Channel",
    "Context",
    "Endpoint",
    "Extent",
    "Future",
    "HostMesh",
    "MeshFailure",
    "Point",
    "Port",
    "PortReceiver",
    "ProcMesh",
    "SupervisionError",
    "ValueMesh",
    "attach_to_workers",
    "concurrent_endpoint",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "default_bootstrap_cmd",
    "endpoint",
    "get_or_spawn_controller",
    "proc_mesh",
    "run_worker_loop_forever",
    "send",
    "shutdown_context",
    "this_host",
    "this_proc",
    "unhandled_fault_hook",  # noqa: F822  # a property of the module's class, above
]
