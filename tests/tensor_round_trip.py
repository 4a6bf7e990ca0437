"""Tensors through a real mesh and back, in whatever environment runs this script.

Run by ``tests/test_wire.py`` with numpy hidden, and by ``.ci/fresh_venv.sh``
in a fresh virtualenv made by the README's quick start (torch's CPU wheel,
which installs no numpy). Prints "tensor round trips ok" or fails loudly.
"""

import warnings

with warnings.catch_warnings():  # torch's own import warning without numpy, in this process
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch

from monarch_nb import Actor, endpoint, this_host
from monarch_nb._controller._client import Controller


class Scale(Actor):
    @endpoint
    def has_numpy(self) -> bool:
        try:
            import numpy  # noqa: F401
        except ImportError:
            return False
        return True

    @endpoint
    def scale(self, tensor: torch.Tensor, by: float) -> torch.Tensor:
        return tensor * by


def main() -> None:
    with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        scale = procs.spawn("scale", Scale)
        ranks_with_numpy = scale.has_numpy.call().get(timeout=60)
        print(f"numpy on the ranks: {ranks_with_numpy}")
        stats = Controller.get().stats
        big = torch.arange(1 << 18, dtype=torch.float32)  # 1 MiB: out of band, encoded once
        before = stats.bytes_out_of_band
        for point, value in scale.scale.call(big, 2).get(timeout=60):
            assert torch.equal(value, big * 2), f"rank {point} returned {value!r}"
        assert stats.bytes_out_of_band - before == 1 << 20, "the 1 MiB tensor went in band"
        small = torch.tensor([1.5, 2.5], dtype=torch.bfloat16)  # in band
        back = scale.slice(procs=0).scale.call_one(small, 2).get(timeout=60)
        assert torch.equal(back, small * 2), f"returned {back!r}"
    print("tensor round trips ok")


if __name__ == "__main__":
    main()
