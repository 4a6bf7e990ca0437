"""What a rank uses right now: CPU time, resident memory, and its GPU when it has one.

Cheap enough to run on every heartbeat (two small reads from ``/proc``), and
never imports anything heavy: GPU figures come from torch only when the rank's
own code already imported torch and initialised CUDA.
"""

from __future__ import annotations

import os
import sys
import time

from .._wire._messages import ResourceSample

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return 0


def sample() -> ResourceSample:
    times = os.times()
    allocated = reserved = None
    utilization = None
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None:
        try:
            if cuda.is_initialized():
                allocated = int(cuda.memory_allocated())
                reserved = int(cuda.memory_reserved())
                utilization = float(cuda.utilization())  # NVML; raises without it
        except Exception:
            pass  # no NVML: memory figures only
    return ResourceSample(
        cpu_seconds=times.user + times.system,
        rss_bytes=rss_bytes(),
        sampled_at=time.monotonic(),
        gpu_memory_allocated=allocated,
        gpu_memory_reserved=reserved,
        gpu_utilization=utilization,
    )
