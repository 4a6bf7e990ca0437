"""A subclass of one of our launcher jobs written against Monarch's internals.

Monarch's ``ProcessJob`` is subclassed in its own tests (its duplex test job)
by overriding ``_create(client_script)`` and filling Monarch's private tables
(``_host_to_pid``) with worker loops it starts itself. Our launcher jobs
(``ProcessJob``, ``SSHJob``, ...) start their own agents: their ``_create``
takes the key file those agents share, and their state comes from what it
returns. Such a subclass would be handed the key file's path as its
``client_script`` and fail in its own code with a misleading message, so it
is refused before, saying how to write that job here.
"""

from __future__ import annotations

import inspect
from typing import Any

from .._model._errors import MeshUsageError


def refuse_monarch_create(job: Any) -> None:
    """Raise if ``type(job)`` overrides our launcher's ``_create`` with Monarch's signature."""
    ours = [c for c in type(job).__mro__ if c.__module__.startswith("monarch_nb.")]
    base = next((c for c in ours if "_create" in vars(c)), None)
    create = type(job)._create
    if base is None or create is vars(base)["_create"]:
        return
    try:
        params = list(inspect.signature(create).parameters)
    except (TypeError, ValueError):
        return
    if len(params) < 2 or params[1] != "client_script":
        return
    name = type(job).__name__
    raise MeshUsageError(
        f"{name} overrides {base.__name__}._create(client_script) as Monarch's "
        f"{base.__name__} is written, but monarch_nb's {base.__name__} starts its own "
        "host agents (its _create takes their key file) and has no duplex gateway "
        "(Monarch's attach(addr)). Write the job to Monarch's JobTrait contract instead: "
        "subclass monarch_nb.job.JobTrait; in _create(client_script) start "
        "`monarch-nb agent --listen ADDR --key-file F` (or run_worker_loop_forever("
        "address=ADDR, ca=F)) per host; in _state() return JobState({'hosts': "
        "attach_to_workers(workers=[ADDR, ...], ca=F)}); in _kill() stop them. The client "
        "dials each worker and the ranks' calls, replies and output come back over those "
        "links; only an actor on a rank calling an actor of the client's own process dials "
        "the client (see docs/monarch.md)"
    )
