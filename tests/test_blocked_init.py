"""An ``__init__`` that never returns (Monarch's test_run_forever_on_init).

Here the actors of one process share its main thread, where each of
Monarch's has its own (docs/actors.md, "Actors in one process"): such an
``__init__`` holds its process. What we promise instead: the spawn returns at
once, ``procs.diagnose()`` shows where the rank blocks, and stopping the mesh
ends it.
"""

from __future__ import annotations

import threading
import time

from monarch_nb import Actor, endpoint, this_host


class Forever(Actor):
    def __init__(self) -> None:
        threading.Event().wait()

    @endpoint
    async def unreachable(self) -> None:
        pass


def test_an_init_that_never_returns_is_shown_where_it_blocks_and_a_stop_ends_it() -> None:
    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        started = time.monotonic()
        procs.spawn("forever", Forever)
        assert time.monotonic() - started < 30  # the spawn does not wait for __init__
        deadline = time.monotonic() + 60
        while True:
            text = str(procs.diagnose())
            if "in __init__" in text or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert "Event().wait()" in text, text
        assert "in __init__" in text, text
        assert "spawn 'forever'" in text, text
    finally:
        procs.stop().get(timeout=60)
