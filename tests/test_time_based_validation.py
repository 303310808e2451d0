"""Lightning's time-based ``val_check_interval`` (``"DD:HH:MM:SS"``, a ``timedelta`` or a dict; issue 53): with the two
lines, validations happen where they happen without them, under a clock faked as Lightning's own tests fake it
(each ``time.monotonic()`` call one tick later), so the library reads the clock only where Lightning would."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_resumable import ResumableDataCallback, ResumableDataModule


class Model(L.LightningModule):
    """Records the steps each validation followed and the samples each step trained."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(2, 1)
        self.validated_after: list[int] = []
        self.trained: list[list[int]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        ids, features = batch
        self.trained.append(ids.tolist())
        return self.net(features).pow(2).mean()

    def on_train_batch_end(self, *args: Any) -> None:
        """Time passes in an epoch ``check_val_every_n_epoch`` skips too, where Lightning reads no clock."""
        every = self.trainer.check_val_every_n_epoch
        if isinstance(every, int) and (self.trainer.current_epoch + 1) % every:
            time.monotonic()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if batch_idx == 0 and not self.trainer.sanity_checking:
            self.validated_after.append(self.trainer.global_step)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class PlainData(L.LightningDataModule):
    def __init__(self, size: int = 36) -> None:
        super().__init__()
        self.train_set = TensorDataset(torch.arange(size), torch.randn(size, 2))
        self.val_set = TensorDataset(torch.arange(4), torch.randn(4, 2))

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.train_set, batch_size=4, shuffle=True)

    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.val_set, batch_size=2)


class ResumableData(ResumableDataModule, PlainData):
    pass


@contextmanager
def ticking_clock() -> Iterator[list[int]]:
    """``time.monotonic`` faked as a counter of its calls (one second each), as Lightning's tests fake it."""
    reads = [0]

    def tick() -> float:
        reads[0] += 1
        return float(reads[0] - 1)

    with mock.patch("time.monotonic", side_effect=tick):
        yield reads


def fit(
    tmp_path: Path, resumable: bool, epochs: int, checkpointing: bool = False, **trainer_options: Any
) -> tuple[Model, int]:
    torch.manual_seed(0)
    model, data = Model(), (ResumableData() if resumable else PlainData())
    callbacks = [ResumableDataCallback()] if resumable else []
    trainer = L.Trainer(
        default_root_dir=tmp_path / ("resumable" if resumable else "plain"),
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        limit_val_batches=1,
        logger=False,
        enable_checkpointing=checkpointing,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=callbacks,
        **trainer_options,
    )
    with ticking_clock() as reads:
        trainer.fit(model, data)
    return model, reads[0]


INTERVALS = [
    (None, "00:00:00:04", 9),
    (1, "00:00:00:06", 9),
    (2, "00:00:00:06", 9),
    (2, "00:00:00:03", 9),
    (2, "00:00:00:20", 9),
    (1, timedelta(seconds=5), None),
    (1, {"seconds": 3}, None),
]


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize(("every_n_epochs", "interval", "limit"), INTERVALS)
def test_validations_are_where_lightning_puts_them_under_a_faked_clock(
    tmp_path: Path, every_n_epochs: int | None, interval: Any, limit: int | None, checkpointing: bool
) -> None:
    """Also with Lightning's default ``ModelCheckpoint`` (a save at each validation's or epoch's end)."""
    options = dict(val_check_interval=interval, check_val_every_n_epoch=every_n_epochs, limit_train_batches=limit)
    plain, plain_reads = fit(tmp_path, False, 5, checkpointing, **options)
    resumable, reads = fit(tmp_path, True, 5, checkpointing, **options)
    assert plain.validated_after, "the clock put no validation in the run: the test would show nothing"
    assert resumable.validated_after == plain.validated_after
    assert reads == plain_reads, "the library read the clock"
