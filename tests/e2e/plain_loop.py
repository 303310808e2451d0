"""A plain multi-epoch loop without Lightning and without ``set_epoch``: ``ResumableSampler`` in a user's
``StatefulDataLoader``, on 2 gloo processes. ``python plain_loop.py OUT NUM_WORKERS PORT``

Three phases, each with a sampler and a loader of its own (the library keeps no state elsewhere):
``full`` trains 3 epochs straight; ``stop`` trains 1 epoch and saves each rank's
``loader.state_dict()`` taken after the epoch's iterator ran out, as a loop that checkpoints
between epochs does; ``resume`` loads that file and trains the 2 epochs left. Each rank writes the
ids of every batch, a JSON line per batch, to ``OUT/PHASE.rank{R}.jsonl``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_resumable import ResumableSampler

EPOCHS, STOP_AFTER = 3, 1


def run(rank: int, out: Path, num_workers: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    for phase in ("full", "stop", "resume"):
        train(rank, out, num_workers, phase)
        dist.barrier()
    dist.destroy_process_group()


def train(rank: int, out: Path, num_workers: int, phase: str) -> None:
    data = list(range(22))
    sampler = ResumableSampler(data, num_replicas=2, rank=rank, seed=5, batch_size=3)
    # Forked workers, as torch forks them in a process it did not spawn: under mp.spawn torch spawns
    # them too, which re-imports torch in each (3 s a worker here, 56 s for this test).
    context = "fork" if num_workers else None
    loader = StatefulDataLoader(
        data, batch_size=3, sampler=sampler, num_workers=num_workers, multiprocessing_context=context
    )
    state_path = out / f"state.rank{rank}.pt"
    epochs = range(EPOCHS)
    if phase == "stop":
        epochs = range(STOP_AFTER)
    elif phase == "resume":
        loader.load_state_dict(torch.load(state_path, weights_only=False))
        epochs = range(STOP_AFTER, EPOCHS)
    with (out / f"{phase}.rank{rank}.jsonl").open("w") as log:
        for epoch in epochs:  # no set_epoch: every epoch repeats the order, as with DistributedSampler
            for batch in loader:
                log.write(json.dumps({"epoch": epoch, "ids": batch.tolist()}) + "\n")
    if phase == "stop":
        torch.save(loader.state_dict(), state_path)


if __name__ == "__main__":
    out, num_workers, port = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    torch.multiprocessing.spawn(run, args=(out, num_workers, port), nprocs=2)
