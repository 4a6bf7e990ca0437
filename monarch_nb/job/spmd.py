"""SPMD jobs as in Monarch's ``monarch.job.spmd``: ``serve()`` a torchrun command
once, then ``run_spmd()`` it as often as you like on the same hosts.

::

    from monarch_nb.job.spmd import serve

    job = serve(["torchrun", "--nproc-per-node=4", "--standalone", "train.py"])
    job.run_spmd()
"""

from __future__ import annotations

from .._jobs._job import job_load
from .._jobs._spmd_job import SPMDJob, serve

__all__ = ["SPMDJob", "job_load", "serve"]
