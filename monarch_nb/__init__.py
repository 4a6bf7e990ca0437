"""monarch_nb: a Jupyter-first, single-controller distributed environment for PyTorch.

Layering (each layer imports only those below it)::

    magics/, widgets/, debug     notebook side: IPython and ipywidgets live here only
    _actor, _proc_mesh           actors, endpoints, process meshes (the public API)
    _controller, _process_group  the controller client, worker processes, supervision
    _calls, _future              calls in flight and the one Future type
    _wire, _serialize, _io_loop  signed messages, pickling, the I/O thread
    _shape, _value_mesh,         plain data: shapes, points, per-rank values, errors
    _errors, _context
    native/                      the one-sided tensor data plane (C extension)

The runtime never imports IPython, ipywidgets or torch: it works from a plain
Python script, and a worker imports torch only when user code does.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._actor import Actor, ActorMesh, Endpoint, endpoint
    from ._calls import ReplyStream
    from ._context import Context, context, current_rank
    from ._controller import WorkerOutput, set_output_handler
    from ._errors import (
        CallTimeout,
        CellError,
        EndpointError,
        MeshFailure,
        MeshUsageError,
        MonarchNbError,
        RemoteError,
        RemoteFailure,
        SerializationError,
        SpawnError,
    )
    from ._future import Future
    from ._proc_mesh import HostMesh, MeshStatistics, ProcInfo, ProcMesh, this_host
    from ._shape import Point, Shape
    from ._value_mesh import ValueMesh

# Public name -> the private module that defines it. Imported on first use
# (PEP 562), so a worker process, which imports this package first, loads
# only the modules it runs, and `import monarch_nb` stays cheap.
_DEFINED_IN = {
    "Actor": "_actor",
    "ActorMesh": "_actor",
    "CallTimeout": "_errors",
    "CellError": "_errors",
    "Context": "_context",
    "Endpoint": "_actor",
    "EndpointError": "_errors",
    "Future": "_future",
    "HostMesh": "_proc_mesh",
    "MeshFailure": "_errors",
    "MeshStatistics": "_proc_mesh",
    "MeshUsageError": "_errors",
    "MonarchNbError": "_errors",
    "Point": "_shape",
    "ProcInfo": "_proc_mesh",
    "ProcMesh": "_proc_mesh",
    "RemoteError": "_errors",
    "RemoteFailure": "_errors",
    "ReplyStream": "_calls",
    "SerializationError": "_errors",
    "Shape": "_shape",
    "SpawnError": "_errors",
    "ValueMesh": "_value_mesh",
    "WorkerOutput": "_controller",
    "context": "_context",
    "current_rank": "_context",
    "endpoint": "_actor",
    "set_output_handler": "_controller",
    "this_host": "_proc_mesh",
}


def __getattr__(name: str) -> Any:
    module = _DEFINED_IN.get(name)
    if module is None:
        raise AttributeError(f"module 'monarch_nb' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    if getattr(value, "__module__", "").startswith("monarch_nb._"):
        try:  # tracebacks and reprs read monarch_nb.X, not monarch_nb._module.X
            value.__module__ = __name__
        except (AttributeError, TypeError):
            pass
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
    "CallTimeout",
    "CellError",
    "Context",
    "Endpoint",
    "EndpointError",
    "Future",
    "HostMesh",
    "MeshFailure",
    "MeshStatistics",
    "MeshUsageError",
    "MonarchNbError",
    "Point",
    "ProcInfo",
    "ProcMesh",
    "RemoteError",
    "RemoteFailure",
    "ReplyStream",
    "SerializationError",
    "Shape",
    "SpawnError",
    "ValueMesh",
    "WorkerOutput",
    "context",
    "current_mesh",
    "current_rank",
    "endpoint",
    "set_output_handler",
    "this_host",
]
