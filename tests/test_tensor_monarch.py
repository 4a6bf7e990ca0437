"""Monarch's tensor-engine idioms on real ranks (gloo on CPU): one 4-rank mesh shared."""

import pytest
import torch

import monarch_nb
from monarch_nb import MeshTensor, distribute
from monarch_nb.tensor import Shard, manual_seed

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def procs(procs4):
    return procs4


def rank_values(mesh):
    """A mesh tensor of shape (1,) holding each rank's index in ``mesh`` (a float)."""
    sizes = mesh.shape.sizes
    value = torch.arange(float(len(mesh.shape))).reshape(sizes)
    local = distribute(value, mesh, [Shard(i) for i in range(len(sizes))]).to_local()
    return local.reshape(1)


# -- to_local() / to_mesh() inside activate() ---------------------------------------------


def test_to_local_inside_activate_mixes_with_factories(procs):
    x = distribute(torch.arange(32.0), procs, [Shard(0)])
    with procs.activate():
        y = x.to_local() + torch.ones(8)
        z = y.to_mesh(procs.slice(procs=slice(0, 4))) * 2
    assert type(y._mt_meta) is torch.Tensor
    assert monarch_nb.inspect(y, procs=1).tolist() == [float(v) for v in range(9, 17)]
    assert monarch_nb.inspect(z, procs=3).tolist() == [2.0 * v for v in range(25, 33)]


def test_ranks_draw_different_values_until_seeded_alike(procs):
    with procs.activate():
        before = torch.rand(4)
    first = before.fetch().get(timeout=60).values()
    assert not all(torch.equal(first[0], v) for v in first[1:])
    manual_seed(3, procs)
    with procs.activate():
        after = torch.rand(4)
    values = after.fetch().get(timeout=60).values()
    assert all(torch.equal(values[0], v) for v in values[1:])
    assert isinstance(after, MeshTensor)
