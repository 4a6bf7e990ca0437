"""SPMD scripts on a mesh as in Monarch's ``monarch.spmd``: SPMDActor, torchrun's environment."""

from __future__ import annotations

from ._services._spmd import (
    SPMDActor,
    run_script,
    setup_torch_elastic_env,
    setup_torch_elastic_env_async,
)

__all__ = ["SPMDActor", "run_script", "setup_torch_elastic_env", "setup_torch_elastic_env_async"]
