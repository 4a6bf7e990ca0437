"""Time ``%mesh restart --replay`` of a short notebook through a real kernel (issue 62).

    python benchmarks/replay_notebook.py [TREE] [--show-output | --skip-display]

TREE: a checkout to import monarch_nb from (``git archive REV | tar -x -C TREE``
and its built ``*.so`` copied in), to compare with an earlier revision; default
this one. Prints one JSON line per run (three): the wall time of the replay and
the output messages it sent to the notebook.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from kernel_utils import Kernel

CELLS = [
    "%%mesh\nimport torch, time\nmodel = torch.nn.Linear(10, 1)\n"
    "print('model on rank', rank, sum(p.numel() for p in model.parameters()))",
    "%%mesh\nfrom tqdm import tqdm\nfor i in tqdm(range(40)):\n    time.sleep(0.005)",
    "%%mesh\nimport matplotlib\nmatplotlib.use('agg')\nimport matplotlib.pyplot as plt\n"
    "from IPython.display import display\nfig, ax = plt.subplots(figsize=(3, 2))\n"
    "ax.plot([rank, 1, 2])\ndisplay(fig)\nplt.close(fig)",
    "%%mesh\nx = torch.ones(2) * rank\ndist.all_reduce(x)\nprint('reduced', x)",
    "%%mesh\nprint('sum', x.sum().item())",
]


def main() -> None:
    args = sys.argv[1:]
    tree = args.pop(0) if args and not args[0].startswith("--") else None
    env = {"PYTHONPATH": tree} if tree else {}
    with Kernel(env=env) as kernel:
        kernel.ok("%load_ext monarch_nb")
        kernel.ok("%mesh start --procs 4 --dist gloo --no-dashboard", timeout=120)
        for cell in CELLS:
            kernel.ok(cell, timeout=120)
        for run in range(3):
            start = time.monotonic()
            reply = kernel.ok("%mesh restart --replay " + " ".join(args), timeout=300)
            wall = time.monotonic() - start
            kinds: dict[str, int] = {}
            for message in reply.outputs:
                kinds[message["msg_type"]] = kinds.get(message["msg_type"], 0) + 1
            print(
                json.dumps(
                    {"tree": tree or ".", "options": args, "run": run, "wall_s": round(wall, 2)}
                    | {"outputs": kinds}
                )
            )


if __name__ == "__main__":
    main()
