"""An unmodified torchrun-style script: reads torchrun's variables, all-reduces, writes a file."""

import argparse
import os

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--scale", type=float, default=1.0)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
x = torch.full((2,), float(rank) * args.scale)
dist.all_reduce(x)
keys = ("LOCAL_RANK", "GROUP_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE")
with open(os.path.join(args.out, f"rank{rank}.txt"), "w") as f:
    f.write(f"{world} {x.tolist()} " + " ".join(os.environ[k] for k in keys))
print(f"rank {rank} of {world}: {x.tolist()}")
dist.destroy_process_group()
if os.environ.get("SPMD_FAIL"):
    raise SystemExit(3)
