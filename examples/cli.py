"""LightningCLI with lightning-resumable: the callback and its options come from YAML.

Run from the repository's root:

    python examples/cli.py fit --config examples/config.yaml                 # train
    python examples/cli.py fit --config examples/config.yaml --ckpt_path checkpoints/step=5.ckpt  # resume
    python examples/cli.py fit --trainer.callbacks.help lightning_resumable.ResumableDataCallback  # its options

The config adds ``ResumableDataCallback`` (with an audit log) and a ``ModelCheckpoint`` every 5 steps;
the datamodule is a ``ResumableDataModule``. Compare the audit logs of an interrupted and an
uninterrupted run with ``python -m lightning_resumable compare RUN_A/audit RUN_B/audit``.
"""

from __future__ import annotations

import random
from typing import Any

import lightning as L
import torch
from lightning.pytorch.cli import LightningCLI
from torch.utils.data import DataLoader, Dataset

from lightning_resumable import ResumableDataModule


class AugmentedIds(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Sample ``i``: its id, and features under a random augmentation."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        features = torch.full((8,), float(index % 5)) * (0.5 + torch.rand(()))
        return torch.tensor(index), -features if random.random() < 0.5 else features


class ExampleData(ResumableDataModule, L.LightningDataModule):
    """A shuffled train loader, made exactly resumable by the mixin.

    Args:
        size: samples in the dataset.
        batch_size: samples per batch on each rank.
        num_workers: loader workers per process.
    """

    def __init__(self, size: int = 64, batch_size: int = 4, num_workers: int = 0) -> None:
        super().__init__()
        self.size, self.batch_size, self.num_workers = size, batch_size, num_workers

    def train_dataloader(self) -> DataLoader[Any]:
        dataset = AugmentedIds(self.size)
        return DataLoader(dataset, batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers)


class ExampleModel(L.LightningModule):
    """A small model with dropout.

    Args:
        hidden: width of the hidden layer.
    """

    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.Dropout(0.3), torch.nn.Linear(hidden, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.net(batch[1]).pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    # A resume runs in the same folder as the run it continues: let it write its config over the first.
    LightningCLI(ExampleModel, ExampleData, save_config_kwargs={"overwrite": True})
    if torch.distributed.is_initialized():  # a clean shutdown: at the interpreter's exit, gloo's threads can abort
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
