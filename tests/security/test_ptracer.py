"""Finding 12: a rank lets only its own process tree read its memory.

A buffer owner used to call ``prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)``, so
under Yama ``ptrace_scope=1`` (Ubuntu's default) any process of the user could
ptrace a rank. It now names the root of its tree on this host (the controller,
or a host agent), which Yama reads as "that process and its descendants". This
kernel has no Yama (``/proc/sys/kernel/yama`` is absent), so what is tested
here is the root every rank names, nested meshes included.
"""

from __future__ import annotations

import os
import sys

import cloudpickle

from monarch_nb import Actor, endpoint, this_host
from monarch_nb._wire import _rundir

# The ranks cannot import this directory: send its actors by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class TreeRoot(Actor):
    @endpoint
    def root(self) -> int:
        return _rundir.tree_root()

    @endpoint
    def nested_roots(self, host) -> list[int]:
        with host.spawn_procs(per_host={"procs": 2}, name="nested") as procs:
            return list(procs.spawn("nested_root", TreeRoot).root.call().get(timeout=60).values())


def test_every_rank_of_the_tree_names_the_controller_as_its_ptracer():
    assert _rundir.tree_root() == os.getpid()  # the controller is the root
    with this_host().spawn_procs(per_host={"procs": 2}, name="ptracer") as procs:
        roots = procs.spawn("roots", TreeRoot)
        assert roots.root.call().get(timeout=60).values() == [os.getpid()] * 2
        nested = roots.slice(procs=0).nested_roots.call_one(this_host()).get(timeout=120)
        assert nested == [os.getpid()] * 2
