"""monarch_nb: a Jupyter-first, single-controller distributed environment for PyTorch.

Layering, lowest last (each layer imports only those below it; the three
processes never import one another; tests/test_layering.py holds it)::

    the face         monarch_nb, .actor, .rdma, .job, .config, .spmd, .fetch, .events
    magics/          %mesh, %%mesh, the panel's comm (IPython lives here)
    debug/ widgets/  the pdb bridge and prompt; the dashboard (ipywidgets)
    tensor/          the tensor engine (torch); the core reaches it through the
                     loader this module installs (_runtime/_tensor_link)
    _jobs/           launchers and jobs: how a mesh gets its hosts
    _controller/ _worker/ _agent/     the three processes
    _services/       logs, metrics, stacks, workspace, spmd, config, process hygiene
    _runtime/        actors, endpoints, calls in flight, references, peers, ports
    native/          the one-sided tensor data plane (C)
    _wire/           sockets, links, signed and typed messages, serialisation, keys
    _model/          shapes, ValueMesh, folding, errors, futures: no I/O

The runtime never imports IPython, ipywidgets or torch: it works from a plain
Python script, and a worker imports torch only when user code does
(docs/layout.md).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._runtime import _tensor_link

if TYPE_CHECKING:
    from . import events, fetch
    from ._controller._actor_mesh import ActorMesh, Endpoint
    from ._controller._bootstrap_command import BootstrapCommand, default_bootstrap_cmd
    from ._controller._diagnose import Diagnosis
    from ._controller._events import RankState
    from ._controller._legacy_spawn import proc_mesh
    from ._controller._proc_mesh import HostMesh, ProcMesh, shutdown_context, this_host
    from ._controller._recovery import RestartPolicy
    from ._controller._stacks import Profile, Stacks
    from ._controller._status import MeshState, MeshStatus, RankStatus, RestartRecord
    from ._controller._telemetry import TelemetrySample
    from ._controller._timeline import Timeline
    from ._jobs._launchers import attach, slurm_hosts, ssh_hosts
    from ._jobs._worker_loop import attach_to_workers, run_worker_loop_forever
    from ._model._errors import (
        CallCancelled,
        CallTimeout,
        CellError,
        EndpointError,
        MeshFailure,
        MeshStopped,
        MeshUsageError,
        MonarchNbError,
        ProfilerUnavailable,
        RemoteError,
        RemoteFailure,
        ReplayError,
        SerializationError,
        SpawnError,
        SupervisionError,
    )
    from ._model._future import Future
    from ._model._shape import Extent, Point, Shape
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
    from ._runtime._pending import ReplyStream
    from ._runtime._ports import Channel, Port, PortReceiver
    from ._runtime._singletons import get_or_spawn_controller
    from ._services._logs import LogLine
    from ._services._metrics import log_metric
    from .debug._remote import breakpoint
    from .tensor._active import get_active_mesh, no_mesh
    from .tensor._api import (
        distribute,
        fetch_shard,
        inspect,
        module_to_mesh,
        show,
        slice_mesh,
        to_mesh,
    )
    from .tensor._gradient import grad_function, grad_generator
    from .tensor._remote import call_on_shard_and_fetch, remote
    from .tensor._simulator import Simulator
    from .tensor._streams import Stream, get_active_stream
    from .tensor._tensor import MeshTensor

# Public name -> the private module that defines it. Imported on first use
# (PEP 562), so a worker process, which imports this package first, loads
# only the modules it runs, and `import monarch_nb` stays cheap.
_DEFINED_IN = {
    "Actor": "_runtime._actors",
    "Channel": "_runtime._ports",
    "ActorMesh": "_controller._actor_mesh",
    "BootstrapCommand": "_controller._bootstrap_command",
    "CallCancelled": "_model._errors",
    "CallTimeout": "_model._errors",
    "CellError": "_model._errors",
    "Context": "_runtime._context",
    "Diagnosis": "_controller._diagnose",
    "Endpoint": "_controller._actor_mesh",
    "EndpointError": "_model._errors",
    "Extent": "_model._shape",
    "Future": "_model._future",
    "HostMesh": "_controller._proc_mesh",
    "LogLine": "_services._logs",
    "MeshFailure": "_model._errors",
    "MeshStopped": "_model._errors",
    "MeshState": "_controller._status",
    "MeshStatus": "_controller._status",
    "MeshTensor": "tensor._tensor",
    "MeshUsageError": "_model._errors",
    "MonarchNbError": "_model._errors",
    "Point": "_model._shape",
    "Port": "_runtime._ports",
    "PortReceiver": "_runtime._ports",
    "ProcMesh": "_controller._proc_mesh",
    "Profile": "_controller._stacks",
    "ProfilerUnavailable": "_model._errors",
    "RankState": "_controller._events",
    "RankStatus": "_controller._status",
    "ReplayError": "_model._errors",
    "SupervisionError": "_model._errors",
    "RemoteError": "_model._errors",
    "RemoteFailure": "_model._errors",
    "ReplyStream": "_runtime._pending",
    "RestartPolicy": "_controller._recovery",
    "RestartRecord": "_controller._status",
    "SerializationError": "_model._errors",
    "Shape": "_model._shape",
    "Simulator": "tensor._simulator",
    "SpawnError": "_model._errors",
    "TelemetrySample": "_controller._telemetry",
    "Timeline": "_controller._timeline",
    "Stacks": "_controller._stacks",
    "Stream": "tensor._streams",
    "ValueMesh": "_model._value_mesh",
    "Accumulator": "_runtime._accumulator",
    "attach": "_jobs._launchers",
    "attach_to_workers": "_jobs._worker_loop",
    "breakpoint": "debug._remote",
    "call_on_shard_and_fetch": "tensor._remote",
    "concurrent_endpoint": "_runtime._actors",
    "context": "_runtime._context",
    "current_actor_name": "_runtime._context",
    "current_rank": "_runtime._context",
    "current_size": "_runtime._context",
    "default_bootstrap_cmd": "_controller._bootstrap_command",
    "distribute": "tensor._api",
    "endpoint": "_runtime._actors",
    "fetch_shard": "tensor._api",
    "get_active_mesh": "tensor._active",
    "get_active_stream": "tensor._streams",
    "get_or_spawn_controller": "_runtime._singletons",
    "grad_function": "tensor._gradient",
    "grad_generator": "tensor._gradient",
    "log_metric": "_services._metrics",
    "inspect": "tensor._api",
    "module_to_mesh": "tensor._api",
    "no_mesh": "tensor._active",
    "proc_mesh": "_controller._legacy_spawn",
    "remote": "tensor._remote",
    "run_worker_loop_forever": "_jobs._worker_loop",
    "send": "_runtime._endpoint",
    "show": "tensor._api",
    "shutdown_context": "_controller._proc_mesh",
    "slice_mesh": "tensor._api",
    "slurm_hosts": "_jobs._launchers",
    "ssh_hosts": "_jobs._launchers",
    "this_host": "_controller._proc_mesh",
    "this_proc": "_runtime._local_actors",
    "to_mesh": "tensor._api",
}


def _load_tensor_engine(module: str) -> Any:
    return importlib.import_module(f"{__name__}.tensor{module}")


# The core reaches the tensor engine (above it) only through this loader.
_tensor_link.install(_load_tensor_engine)


def __getattr__(name: str) -> Any:
    if name in ("events", "fetch"):
        return importlib.import_module(f"{__name__}.{name}")
    module = _DEFINED_IN.get(name)
    if module is None:
        raise AttributeError(f"module 'monarch_nb' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__version__ = "0.1.0"


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext monarch_nb``: register ``%mesh`` and ``%%mesh``."""
    from .magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext monarch_nb``: stop every notebook mesh, remove the magics."""
    from .magics import unload_ipython_extension as unload

    unload(ipython)


def current_mesh(name: str | None = None) -> Any:
    """The mesh ``%%mesh`` runs on (the last started), or the one called ``name``."""
    from .magics import current_mesh as current

    return current(name)


__all__ = [
    "Accumulator",
    "Actor",
    "ActorMesh",
    "BootstrapCommand",
    "CallCancelled",
    "CallTimeout",
    "CellError",
    "Channel",
    "Context",
    "Diagnosis",
    "Endpoint",
    "EndpointError",
    "Extent",
    "Future",
    "HostMesh",
    "LogLine",
    "MeshFailure",
    "MeshState",
    "MeshStatus",
    "MeshStopped",
    "MeshTensor",
    "MeshUsageError",
    "MonarchNbError",
    "Point",
    "Port",
    "PortReceiver",
    "ProcMesh",
    "Profile",
    "ProfilerUnavailable",
    "RankState",
    "RankStatus",
    "RemoteError",
    "RemoteFailure",
    "ReplayError",
    "ReplyStream",
    "RestartPolicy",
    "RestartRecord",
    "SerializationError",
    "Shape",
    "Simulator",
    "SpawnError",
    "Stacks",
    "Stream",
    "SupervisionError",
    "TelemetrySample",
    "Timeline",
    "ValueMesh",
    "attach",
    "attach_to_workers",
    "breakpoint",
    "call_on_shard_and_fetch",
    "concurrent_endpoint",
    "context",
    "current_actor_name",
    "current_mesh",
    "current_rank",
    "current_size",
    "default_bootstrap_cmd",
    "distribute",
    "endpoint",
    "events",
    "fetch",
    "fetch_shard",
    "get_active_mesh",
    "get_active_stream",
    "get_or_spawn_controller",
    "grad_function",
    "grad_generator",
    "inspect",
    "log_metric",
    "module_to_mesh",
    "no_mesh",
    "proc_mesh",
    "remote",
    "run_worker_loop_forever",
    "send",
    "show",
    "shutdown_context",
    "slice_mesh",
    "slurm_hosts",
    "ssh_hosts",
    "this_host",
    "this_proc",
    "to_mesh",
]
