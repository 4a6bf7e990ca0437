"""``%mesh activate`` / ``%mesh deactivate`` through a real kernel."""

from __future__ import annotations

import pytest
from kernel_utils import Kernel

pytestmark = pytest.mark.timeout(120)


def test_mesh_activate_runs_the_cells_torch_on_the_mesh():
    with Kernel() as k:
        k.ok("%load_ext monarch_nb")
        k.ok("%mesh start --procs 2 --name m --no-dashboard")
        assert "torch now runs on mesh 'm'" in k.ok("%mesh activate").text()
        k.ok("import torch\nx = torch.ones(2) * 3")
        assert k.ok("print(type(x).__name__, tuple(x.shape))").stream() == "MeshTensor (2,)\n"
        assert "runs in this kernel again" in k.ok("%mesh deactivate").text()
        reply = k.ok(
            "import monarch_nb\n"
            "print(monarch_nb.inspect(x, procs=1).tolist(), type(torch.ones(1)).__name__)"
        )
        assert reply.stream() == "[3.0, 3.0] Tensor\n"
        k.ok("%mesh activate m")
        k.ok("%mesh stop")  # deactivates too
        assert k.ok("print(type(torch.ones(1)).__name__)").stream() == "Tensor\n"
