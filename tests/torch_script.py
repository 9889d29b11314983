"""A torchrun-style script for Distributor.run(path, *args): its arguments and environment to a file."""

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--exit-code", type=int, default=0)
args = parser.parse_args()
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
rank = dist.get_rank()
with open(os.path.join(args.out, f"rank-{rank}.json"), "w") as f:
    json.dump({"rank": rank, "sum": t.item(), "local_rank": os.environ["LOCAL_RANK"], "argv": sys.argv[1:]}, f)
print(f"script rank {rank} done", flush=True)
print(f"script rank {rank} on stderr", file=sys.stderr, flush=True)
dist.destroy_process_group()
sys.exit(args.exit_code if rank == 1 else 0)
