"""Stress run for the after-fork deadlock (CPython gh-112275): many consecutive worker start-ups in DDP.

``python benchmarks/fork_stress.py [EPOCHS] [--several]`` trains 2 DDP processes (gloo, CPU) with a
``ResumableDataModule`` loader of 2 workers for EPOCHS epochs (default 200) of 2 short batches; every
epoch starts a new iterator, which forks 2 new workers on each rank. ``--several``: two loaders of 2
workers in a ``CombinedLoader`` (``max_size``) of different sizes, both running out at the epoch's last
batch, so one's iterator threads are ending while the other forks the next epoch's workers (a hang in
CI before the library joined every retired iterator's threads before any of its loaders forks). Rank 0 prints the
number of worker start-ups (iterators that forked workers, over both ranks), the workers forked and
the time.
On an affected CPython a hang shows as a run that never ends: run it under a timeout, e.g.
``timeout -s INT 900 python benchmarks/fork_stress.py``.
"""

from __future__ import annotations

import sys
import time
import warnings
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import CombinedLoader
from torch.utils.data import DataLoader, Dataset

from lightning_resumable import ResumableDataCallback, ResumableDataModule

WORLD_SIZE, WORKERS = 2, 2


class Numbers(Dataset[torch.Tensor]):
    def __init__(self, size: int = 16) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((4,), float(index))


class Data(ResumableDataModule, L.LightningDataModule):
    def __init__(self, several: bool) -> None:
        super().__init__()
        self.several = several

    def train_dataloader(self) -> Any:
        loader = DataLoader(Numbers(), batch_size=4, shuffle=True, num_workers=WORKERS)
        if not self.several:
            return loader
        short = DataLoader(Numbers(12), batch_size=4, shuffle=True, num_workers=WORKERS)  # 4 + 2 samples per rank
        return CombinedLoader({"long": loader, "short": short}, "max_size")


class Model(L.LightningModule):
    def __init__(self, loaders: int) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.startups, self.loaders = 0, loaders

    def on_train_epoch_start(self) -> None:
        self.startups += self.loaders  # persistent_workers=False: each epoch's iterators fork new workers

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        batch = batch["long"] if isinstance(batch, dict) else batch
        return self.net(batch).pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main(epochs: int, several: bool) -> None:
    warnings.filterwarnings("ignore", category=UserWarning)
    torch.set_num_threads(1)
    model = Model(2 if several else 1)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=WORLD_SIZE,
        strategy="ddp",
        max_epochs=epochs,
        callbacks=[ResumableDataCallback(verify=False)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    started = time.perf_counter()
    trainer.fit(model, Data(several))
    elapsed = time.perf_counter() - started
    startups = int(trainer.strategy.reduce(torch.tensor(float(model.startups)), reduce_op="sum").item())
    if trainer.is_global_zero:
        print(
            f"fork stress{' (several loaders)' if several else ''}: {startups} consecutive worker start-ups"
            f" ({startups * WORKERS} workers forked) on"
            f" {WORLD_SIZE} ranks, Python {sys.version.split()[0]}, {elapsed:.1f} s, no hang"
        )
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    arguments = [argument for argument in sys.argv[1:] if argument != "--several"]
    main(int(arguments[0]) if arguments else 200, several="--several" in sys.argv[1:])
