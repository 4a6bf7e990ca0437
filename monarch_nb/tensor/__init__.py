"""The tensor engine: tensors that live on a mesh, programmed from the controller.

::

    with procs.activate():                 # factories and ops run on every rank
        x = torch.rand(3, 4)               # a MeshTensor: shape and dtype known here
        y = (x @ x.T).reduce("procs", "sum")
    monarch_nb.inspect(y, procs=0)         # one rank's value, as a local tensor

Layering: ``_worker`` (the rank-side actor; imports nothing from the
controller side) and ``_errors`` below ``_engine`` (batches, refs, reads per
process group), below ``_tensor`` (MeshTensor and its dispatcher), below
``_api`` (activate, inspect, show, distribute, module_to_mesh). The core
reaches this package only through ``ProcMesh.activate()``. Importing this
package is cheap; its modules (and torch) load on first use, so a worker
that unpickles the rank-side actor loads only ``_worker``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.distributed.tensor import Partial, Replicate, Shard

    from ._active import get_active_mesh, no_mesh
    from ._api import (
        Activation,
        activate,
        distribute,
        fetch_shard,
        inspect,
        manual_seed,
        module_to_mesh,
        ref_counts,
        show,
        slice_mesh,
        to_mesh,
    )
    from ._errors import MeshTensorError
    from ._gradient import grad_function, grad_generator
    from ._remote import Remote, call_on_shard_and_fetch, remote
    from ._streams import Borrow, Stream, get_active_stream
    from ._tensor import MeshSliceTensor, MeshTensor

_DEFINED_IN = {
    "Activation": "._api",
    "Borrow": "._streams",
    "MeshSliceTensor": "._tensor",
    "MeshTensor": "._tensor",
    "MeshTensorError": "._errors",
    "Partial": "torch.distributed.tensor",
    "Remote": "._remote",
    "Replicate": "torch.distributed.tensor",
    "Shard": "torch.distributed.tensor",
    "Stream": "._streams",
    "activate": "._api",
    "call_on_shard_and_fetch": "._remote",
    "distribute": "._api",
    "fetch_shard": "._api",
    "get_active_mesh": "._active",
    "get_active_stream": "._streams",
    "grad_function": "._gradient",
    "grad_generator": "._gradient",
    "inspect": "._api",
    "manual_seed": "._api",
    "module_to_mesh": "._api",
    "no_mesh": "._active",
    "ref_counts": "._api",
    "remote": "._remote",
    "show": "._api",
    "slice_mesh": "._api",
    "to_mesh": "._api",
}


def __getattr__(name: str) -> Any:
    module = _DEFINED_IN.get(name)
    if module is None:
        raise AttributeError(f"module 'monarch_nb.tensor' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "Activation",
    "Borrow",
    "MeshSliceTensor",
    "MeshTensor",
    "MeshTensorError",
    "Partial",
    "Remote",
    "Replicate",
    "Shard",
    "Stream",
    "activate",
    "call_on_shard_and_fetch",
    "distribute",
    "fetch_shard",
    "get_active_mesh",
    "get_active_stream",
    "grad_function",
    "grad_generator",
    "inspect",
    "manual_seed",
    "module_to_mesh",
    "no_mesh",
    "ref_counts",
    "remote",
    "show",
    "slice_mesh",
    "to_mesh",
]
