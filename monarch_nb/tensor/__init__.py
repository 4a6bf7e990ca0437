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

    from ._api import (
        Activation,
        activate,
        distribute,
        inspect,
        manual_seed,
        module_to_mesh,
        ref_counts,
        show,
    )
    from ._errors import MeshTensorError
    from ._tensor import MeshTensor

_DEFINED_IN = {
    "Activation": "._api",
    "MeshTensor": "._tensor",
    "MeshTensorError": "._errors",
    "Partial": "torch.distributed.tensor",
    "Replicate": "torch.distributed.tensor",
    "Shard": "torch.distributed.tensor",
    "activate": "._api",
    "distribute": "._api",
    "inspect": "._api",
    "manual_seed": "._api",
    "module_to_mesh": "._api",
    "ref_counts": "._api",
    "show": "._api",
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
    "MeshTensor",
    "MeshTensorError",
    "Partial",
    "Replicate",
    "Shard",
    "activate",
    "distribute",
    "inspect",
    "manual_seed",
    "module_to_mesh",
    "ref_counts",
    "show",
]
