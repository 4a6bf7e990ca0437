"""torch.distributed's rendezvous for a mesh, without a port open to the network.

``init_process_group`` with ``env://`` starts torch's TCPStore on rank 0, and
that store listens on every interface, unauthenticated (PyTorch's security
policy says to keep it off untrusted networks). On one host there is no need
for a port at all: ranks meet in a FileStore in the tree's private run
directory (mode 0700, our uid only). Meshes on several hosts still use
``env://`` (MASTER_ADDR on the first host): docs/security.md says so.
"""

from __future__ import annotations

import os
import secrets
from typing import Any

from . import _rundir

# Set by the controller for ranks on its own host: a fresh file in the run directory.
STORE_ENV = "MONARCH_NB_DIST_FILE"


def fresh_store_path() -> str:
    """A new rendezvous file in the tree's private run directory: one per process
    group, since a FileStore holds what its group wrote."""
    return os.path.join(_rundir.run_dir(), f"dist-{secrets.token_hex(8)}")


def init_kwargs() -> dict[str, Any]:
    """The rendezvous arguments for ``torch.distributed.init_process_group`` here."""
    path = os.environ.get(STORE_ENV)
    if not path:
        return {}  # env:// (several hosts)
    return {
        "init_method": f"file://{path}",
        "rank": int(os.environ["RANK"]),
        "world_size": int(os.environ["WORLD_SIZE"]),
    }


def init_process_group(backend: str, **kwargs: Any) -> None:
    """``torch.distributed.init_process_group(backend)`` with this mesh's rendezvous."""
    import torch.distributed as dist

    dist.init_process_group(backend, **init_kwargs(), **kwargs)
