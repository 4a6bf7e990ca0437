"""Fixtures for the hardening suite: faults, load, bad input.

The leak checks of ``tests/conftest.py`` apply here too (pytest loads a
directory's conftest for every test below it): each test, and each module's
fixtures, must leave no worker process behind.

Everything this suite needs from inside the runtime goes through
:func:`_wire_access` (the ``wire_access`` fixture), the one place that reads
private attributes, so a change of the runtime's internals means one function
to adapt. Helpers that need no fixture live in ``chaos_support.py``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

# Workers import this suite's actor classes by reference, like a user's library.
_CHAOS_DIR = os.path.dirname(os.path.abspath(__file__))
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (_CHAOS_DIR, os.environ.get("PYTHONPATH", "")) if p
)


@dataclass(frozen=True)
class WireAccess:
    """What a rogue on this host could learn or guess about a mesh's wire."""

    address: str  # the controller's ROUTER endpoint every worker connects to
    identities: tuple[bytes, ...]  # the zmq identity of each rank, by rank
    key: bytes  # the mesh's signing key (to build *valid* frames for replay tests)


def _wire_access(procs: Any) -> WireAccess:
    """The controller socket, rank identities and signing key of ``procs``.

    The only reach into private attributes in this suite: adapt it here when
    the runtime's internals move.
    """
    group = procs._group
    return WireAccess(
        address=group.controller.address,
        identities=tuple(w.identity for w in group.workers),
        key=group._key,
    )


@pytest.fixture(name="wire_access")
def wire_access_fixture() -> Callable[[Any], WireAccess]:
    """``wire_access(procs)``: see :func:`_wire_access`."""
    return _wire_access


@pytest.fixture
def procs3() -> Iterator[Any]:
    """A fresh 3-process mesh for tests that break it (no echo of rank output)."""
    from monarch_nb import this_host

    procs = this_host().spawn_procs(per_host={"procs": 3}, name="chaos", echo_output=False)
    yield procs
    procs.stop()
