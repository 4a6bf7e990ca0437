"""Fixtures for multi-host tests: several hosts on this machine, each a network
namespace with its own sshd (cluster.py), and a one-machine SLURM cluster (slurm.py).

They skip, saying why, where the machine cannot provide them (not root, no
``ip netns``, no sshd/SLURM): CI runs ``.ci/install_multihost.sh`` first.
"""

from __future__ import annotations

import functools
import site
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cluster import NetnsCluster, unavailable_reason
from slurm import SlurmCluster, slurm_unavailable_reason


@functools.cache
def _netns_unavailable() -> str | None:
    return unavailable_reason()


def _require_netns() -> None:
    reason = _netns_unavailable()
    if reason:
        pytest.skip(f"no network-namespace hosts: {reason}")


@pytest.fixture
def netns_cluster() -> Iterator[Callable[[int], NetnsCluster]]:
    """A factory: ``netns_cluster(n)`` builds a fresh n-host cluster, removed after the
    test (building one takes ~0.1 s per host). For tests that cut links or kill hosts."""
    _require_netns()
    made: list[NetnsCluster] = []

    def make(n_hosts: int) -> NetnsCluster:
        made.append(NetnsCluster(n_hosts))
        return made[-1]

    yield make
    errors = []
    for cluster in made:
        try:
            cluster.close()
        except RuntimeError as e:
            errors.append(str(e))
    if errors:
        pytest.fail("; ".join(errors), pytrace=False)


def _module_cluster(n_hosts: int) -> Iterator[NetnsCluster]:
    _require_netns()
    cluster = NetnsCluster(n_hosts)
    try:
        yield cluster
    finally:
        cluster.close()  # raises, failing the module's last test, if anything is left


@pytest.fixture(scope="module")
def cluster2() -> Iterator[NetnsCluster]:
    """Two hosts shared by a module's tests, which must leave every host healthy."""
    yield from _module_cluster(2)


@pytest.fixture(scope="module")
def cluster4() -> Iterator[NetnsCluster]:
    """Four hosts shared by a module's tests, which must leave every host healthy."""
    yield from _module_cluster(4)


def _require_slurm() -> None:
    _require_netns()
    reason = slurm_unavailable_reason()
    if reason:
        pytest.skip(f"no SLURM cluster: {reason}")


@pytest.fixture(scope="module")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A two-node SLURM cluster whose nodes are the two hosts of a NetnsCluster
    (``slurm_cluster.hosts``): node ``host<i>`` runs its tasks in namespace i.
    Clients need ``slurm_cluster.env`` (SLURM_CONF) in their environment."""
    _require_slurm()
    with NetnsCluster(2) as hosts, SlurmCluster(hosts) as slurm:
        yield slurm


@pytest.fixture
def host_venv(tmp_path) -> Path:
    """A virtual environment with this interpreter's packages (monarch_nb among
    them), for ``python=`` on the hosts, which share this file system."""
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)],
        check=True,
        timeout=120,
    )
    # --system-site-packages would give the base interpreter's packages, not those
    # of a virtualenv pytest runs from: add this interpreter's own site directories
    # (processing their .pth files, which an editable install of monarch_nb uses).
    parents = [*site.getsitepackages(), site.getusersitepackages()]
    (child,) = (venv / "lib").glob("python*/site-packages")
    (child / "_this_pythons_packages.pth").write_text(
        "".join(f"import site; site.addsitedir({path!r})\n" for path in parents)
    )
    return venv


@pytest.fixture
def env_script(tmp_path) -> Path:
    """A shell file for ``env_setup`` that exports MNB_FROM_ENV_SETUP=loaded."""
    setup = tmp_path / "env.sh"
    setup.write_text("export MNB_FROM_ENV_SETUP=loaded\n")
    return setup
