"""``Simulator(hosts, gpus, trace_mode=...)``: Monarch's tensor-engine simulator,
which monarch_nb does not have; calling it says so and what to do instead.

Monarch's simulator replays a program's tensor commands on fake tensors
against a model of devices and links, for a machine larger than the one at
hand, and writes a trace. What a user of it wants, here, is served by running
the same program for real on a CPU mesh of the same shape on this machine:
``this_host().spawn_procs(per_host={"gpus": N})`` starts N ranks (as many as
the cores allow), the program runs on their CPUs unchanged but for the device,
and ``procs.timeline()`` (``%mesh timeline``) shows each rank's calls in time.
That answers what runs where, in what order, and whether it deadlocks, with
real values; a model of GPU time it cannot give, and neither can a fake-tensor
replay without a cost model of the hardware, which would be a guess here.
"""

from __future__ import annotations

from typing import Any, NoReturn

ALTERNATIVE = (
    "run the program on a CPU mesh of the same shape instead: "
    "procs = this_host().spawn_procs(per_host={{'gpus': {gpus}}}) (tensors on 'cpu'), "
    "then procs.timeline() or %mesh timeline for each rank's calls in time"
)


def Simulator(hosts: int, gpus: int, **options: Any) -> NoReturn:  # Monarch's name
    """Monarch's simulator is not provided: raises NotImplementedError naming what to
    do instead (see the module's docstring for why)."""
    given = ", ".join(f"{k}={v!r}" for k, v in options.items())
    raise NotImplementedError(
        f"Simulator(hosts={hosts!r}, gpus={gpus!r}{', ' + given if given else ''}): "
        "monarch_nb has no tensor-engine simulator; "
        + ALTERNATIVE.format(gpus=gpus if isinstance(gpus, int) else "N")
    )
