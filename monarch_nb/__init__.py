"""monarch_nb: a Jupyter-first, single-controller distributed environment for PyTorch.

Layering (each layer imports only those below it)::

    magics/, widgets/, debug/    notebook side: IPython and ipywidgets live here only
    _controller/                 the controller: its I/O thread, process meshes,
                                 actor meshes and endpoints, calls in flight,
                                 interrupts, the event stream and status snapshots
    _worker/                     a worker process: the main loop that runs actors
                                 and cells, the wire thread, rank namespaces
    _common/                     both sides: signed wire and typed messages,
                                 pickling, shapes, per-rank values, errors,
                                 the one Future type
    native/                      the one-sided tensor data plane (C extension)
    tensor/                      the tensor engine (imports torch): mesh tensors,
                                 reached from the core only by ProcMesh.activate()

``_controller`` and ``_worker`` never import each other. The runtime never
imports IPython, ipywidgets or torch: it works from a plain Python script, and
a worker imports torch only when user code does.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._common import _tensor_link

if TYPE_CHECKING:
    from . import events, fetch
    from ._common._actors import Actor, concurrent_endpoint, endpoint
    from ._common._context import Context, context, current_rank, current_size
    from ._common._endpoint import send
    from ._common._errors import (
        CallCancelled,
        CallTimeout,
        CellError,
        EndpointError,
        MeshFailure,
        MeshUsageError,
        MonarchNbError,
        ProfilerUnavailable,
        RemoteError,
        RemoteFailure,
        ReplayError,
        SerializationError,
        SpawnError,
    )
    from ._common._future import Future
    from ._common._local_actors import this_proc
    from ._common._logs import LogLine
    from ._common._metrics import log_metric
    from ._common._pending import ReplyStream
    from ._common._ports import Channel, Port, PortReceiver
    from ._common._shape import Extent, Point, Shape
    from ._common._value_mesh import ValueMesh
    from ._controller._actor_mesh import ActorMesh, Endpoint
    from ._controller._diagnose import Diagnosis
    from ._controller._events import RankState
    from ._controller._launchers import attach, slurm_hosts, ssh_hosts
    from ._controller._proc_mesh import HostMesh, ProcMesh, shutdown_context, this_host
    from ._controller._recovery import RestartPolicy
    from ._controller._stacks import Profile, Stacks
    from ._controller._status import MeshState, MeshStatus, RankStatus, RestartRecord
    from ._controller._telemetry import TelemetrySample
    from ._controller._timeline import Timeline
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
    from .tensor._streams import Stream, get_active_stream
    from .tensor._tensor import MeshTensor

# Public name -> the private module that defines it. Imported on first use
# (PEP 562), so a worker process, which imports this package first, loads
# only the modules it runs, and `import monarch_nb` stays cheap.
_DEFINED_IN = {
    "Actor": "_common._actors",
    "Channel": "_common._ports",
    "ActorMesh": "_controller._actor_mesh",
    "CallCancelled": "_common._errors",
    "CallTimeout": "_common._errors",
    "CellError": "_common._errors",
    "Context": "_common._context",
    "Diagnosis": "_controller._diagnose",
    "Endpoint": "_controller._actor_mesh",
    "EndpointError": "_common._errors",
    "Extent": "_common._shape",
    "Future": "_common._future",
    "HostMesh": "_controller._proc_mesh",
    "LogLine": "_common._logs",
    "MeshFailure": "_common._errors",
    "MeshState": "_controller._status",
    "MeshStatus": "_controller._status",
    "MeshTensor": "tensor._tensor",
    "MeshUsageError": "_common._errors",
    "MonarchNbError": "_common._errors",
    "Point": "_common._shape",
    "Port": "_common._ports",
    "PortReceiver": "_common._ports",
    "ProcMesh": "_controller._proc_mesh",
    "Profile": "_controller._stacks",
    "ProfilerUnavailable": "_common._errors",
    "RankState": "_controller._events",
    "RankStatus": "_controller._status",
    "ReplayError": "_common._errors",
    "RemoteError": "_common._errors",
    "RemoteFailure": "_common._errors",
    "ReplyStream": "_common._pending",
    "RestartPolicy": "_controller._recovery",
    "RestartRecord": "_controller._status",
    "SerializationError": "_common._errors",
    "Shape": "_common._shape",
    "SpawnError": "_common._errors",
    "TelemetrySample": "_controller._telemetry",
    "Timeline": "_controller._timeline",
    "Stacks": "_controller._stacks",
    "Stream": "tensor._streams",
    "ValueMesh": "_common._value_mesh",
    "attach": "_controller._launchers",
    "breakpoint": "debug._remote",
    "call_on_shard_and_fetch": "tensor._remote",
    "concurrent_endpoint": "_common._actors",
    "context": "_common._context",
    "current_rank": "_common._context",
    "current_size": "_common._context",
    "distribute": "tensor._api",
    "endpoint": "_common._actors",
    "fetch_shard": "tensor._api",
    "get_active_mesh": "tensor._active",
    "get_active_stream": "tensor._streams",
    "grad_function": "tensor._gradient",
    "grad_generator": "tensor._gradient",
    "log_metric": "_common._metrics",
    "inspect": "tensor._api",
    "module_to_mesh": "tensor._api",
    "no_mesh": "tensor._active",
    "remote": "tensor._remote",
    "send": "_common._endpoint",
    "show": "tensor._api",
    "shutdown_context": "_controller._proc_mesh",
    "slice_mesh": "tensor._api",
    "slurm_hosts": "_controller._launchers",
    "ssh_hosts": "_controller._launchers",
    "this_host": "_controller._proc_mesh",
    "this_proc": "_common._local_actors",
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
    "Actor",
    "ActorMesh",
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
    "SpawnError",
    "Stacks",
    "Stream",
    "TelemetrySample",
    "Timeline",
    "ValueMesh",
    "attach",
    "breakpoint",
    "call_on_shard_and_fetch",
    "concurrent_endpoint",
    "context",
    "current_mesh",
    "current_rank",
    "current_size",
    "distribute",
    "endpoint",
    "events",
    "fetch",
    "fetch_shard",
    "get_active_mesh",
    "get_active_stream",
    "grad_function",
    "grad_generator",
    "inspect",
    "log_metric",
    "module_to_mesh",
    "no_mesh",
    "remote",
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
