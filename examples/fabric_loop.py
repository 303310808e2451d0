"""A Lightning Fabric training loop on 2 processes, stopped mid-epoch and resumed exactly.

Run: ``python examples/fabric_loop.py``. It trains three times, each a 2-process DDP run on CPU
(gloo): straight through; stopped after batch 3 of epoch 1 with ``fabric.save``; resumed from that
checkpoint with ``fabric.load``. Then it checks that every rank trained, step for step, the very
sample ids and losses (to the bit) of the uninterrupted run, and prints its verdict.

The data's two lines: the loader's sampler is a `ResumableSampler`; the checkpoint holds
`loader_state` and the resume calls `restore_loader`, which also resets Fabric's count of passes
(``setup_dataloaders`` calls ``set_epoch`` with it on every pass).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_resumable import ResumableSampler
from lightning_resumable.fabric import loader_state, restore_loader

EPOCHS, BATCH_SIZE, WORLD_SIZE = 3, 4, 2
STOP_AT = (1, 3)  # (epoch, batches trained in it)


class Points(Dataset[tuple[int, torch.Tensor, torch.Tensor]]):
    """Sample ``i``: its id, 4 features and a target, all functions of ``i``."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        x = torch.sin(torch.arange(4, dtype=torch.float32) + index)
        return index, x, x.sum(dim=0, keepdim=True) * 0.5


def train(phase: str, out: Path) -> None:
    """One run, on every rank (Fabric starts the other rank by running this script again)."""
    torch.set_num_threads(1)
    fabric = L.Fabric(accelerator="cpu", devices=WORLD_SIZE, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(7)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = fabric.setup(model, optimizer)
    dataset = Points()
    sampler = ResumableSampler(dataset, seed=42, batch_size=BATCH_SIZE)  # rank, world size: the process group
    loader = fabric.setup_dataloaders(DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler))
    checkpoint = out / "stopped.ckpt"
    start_epoch, start_batch = 0, 0
    if phase == "resume":
        rest = fabric.load(checkpoint, {"model": model, "optimizer": optimizer})
        start_epoch, start_batch = restore_loader(loader, rest["data"])
    with (out / f"{phase}.rank{fabric.global_rank}.jsonl").open("w") as records:
        for epoch in range(start_epoch, EPOCHS):
            for batch_idx, (ids, x, y) in enumerate(loader, start=start_batch):
                loss = torch.nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad()
                fabric.backward(loss)
                optimizer.step()
                step = {"epoch": epoch, "batch": batch_idx, "ids": ids.tolist(), "loss": loss.item().hex()}
                records.write(json.dumps(step) + "\n")
                if phase == "stop" and (epoch, batch_idx + 1) == STOP_AT:
                    state = {"model": model, "optimizer": optimizer, "data": loader_state(loader, batch_idx + 1)}
                    fabric.save(checkpoint, state)
                    return  # as a preempted job ends
            start_batch = 0


def steps(out: Path, phase: str, rank: int) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / f"{phase}.rank{rank}.jsonl").read_text().splitlines()]


def main() -> int:
    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory)
        for phase in ("full", "stop", "resume"):
            subprocess.run([sys.executable, __file__, phase, str(out)], check=True, timeout=300)
        exact = True
        for rank in range(WORLD_SIZE):
            full, stopped, resumed = (steps(out, phase, rank) for phase in ("full", "stop", "resume"))
            same = stopped + resumed == full
            exact = exact and same
            print(
                f"rank {rank}: {len(full)} steps uninterrupted; stopped after {len(stopped)}, resumed"
                f" {len(resumed)}; ids and losses {'identical' if same else 'DIFFERENT'}"
            )
        print("VERDICT:", "EXACT - every rank trained the very samples and losses" if exact else "MISMATCH")
        return 0 if exact else 1


if __name__ == "__main__":
    if len(sys.argv) == 3:  # one run, on one rank
        train(sys.argv[1], Path(sys.argv[2]))
        torch.distributed.barrier()  # a clean shutdown: at the interpreter's exit, gloo's threads can abort
        torch.distributed.destroy_process_group()
    else:
        sys.exit(main())
