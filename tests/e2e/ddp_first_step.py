"""Plain torch DDP, no Lightning and no library: does a newly wrapped model's first step all-reduce its
gradients to the same bits as the same step later in a run? ``python ddp_first_step.py WORLD_SIZE PORT``

A resumed run wraps its model anew, so its first step is a new wrapper's first step. Each rank
computes the gradients of the same inputs on fixed weights: 20 steps through one wrapper (a run), then
each step again through a new wrapper (a run's first step after a restart). Prints the count of steps
whose all-reduced gradients differ in any bit.
"""

from __future__ import annotations

import gc
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STEPS = 20


def gradients(model: DistributedDataParallel, inputs: torch.Tensor) -> torch.Tensor:
    model.zero_grad()
    model(inputs).pow(2).mean().backward()
    return torch.cat([parameter.grad.flatten() for parameter in model.module.parameters()])  # type: ignore[union-attr]


def main(rank: int, world_size: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
    generator = torch.Generator().manual_seed(100 + rank)
    inputs = [torch.randn(4, 4, generator=generator) for _ in range(STEPS)]
    run = DistributedDataParallel(net)
    in_a_run = [gradients(run, x) for x in inputs]
    differing = sum(
        not torch.equal(gradients(DistributedDataParallel(net), x), in_a_run[k]) for k, x in enumerate(inputs)
    )
    if rank == 0:
        print(f"world size {world_size}: {differing} of {STEPS} first steps differ", flush=True)
    del run  # no DDP wrapper outlives the group
    gc.collect()
    dist.barrier()  # every rank is done with the group before any tears it down (gloo aborted at exit once)
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size, port = int(sys.argv[1]), int(sys.argv[2])
    torch.multiprocessing.spawn(main, args=(world_size, port), nprocs=world_size)
