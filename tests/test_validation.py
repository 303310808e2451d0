"""Validation samples are drawn under seeds of ``(seed, loader, index)``: the same at every validation,
in workers and in the main process, whatever the global generators held before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset, SequentialSampler

from lightning_resumable import ResumableDataCallback, ResumableDataModule
from lightning_resumable.lightning.validation import (
    UnseededValidationWarning,
    ValidationSeededDataset,
    seed_validation_loaders,
)


class Augmented(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([float(index), torch.rand(()).item()])


class Stream(IterableDataset[int]):
    def __iter__(self) -> Any:
        return iter(range(3))


def values(loader: DataLoader[Any]) -> list[list[float]]:
    return [row for batch in loader for row in batch.tolist()]


def test_each_validation_sample_draws_the_same_values_at_every_validation_and_in_workers() -> None:
    (loader,) = seed_validation_loaders([DataLoader(Augmented(), batch_size=2)], seed=7)
    assert isinstance(loader.dataset, ValidationSeededDataset) and len(loader.dataset) == 6
    first = values(loader)
    torch.manual_seed(123)  # the training steps left the generators elsewhere
    assert values(loader) == first
    with_workers = seed_validation_loaders(DataLoader(Augmented(), batch_size=2, num_workers=2), seed=7)
    assert values(with_workers) == first
    assert len({row[1] for row in first}) == 6  # each sample its own draw
    other_seed = seed_validation_loaders(DataLoader(Augmented(), batch_size=2), seed=8)
    assert values(other_seed) != first


def test_fetching_a_validation_batch_leaves_the_main_processs_generators_as_they_were() -> None:
    loader = seed_validation_loaders(DataLoader(Augmented(), batch_size=2), seed=7)
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    loader.dataset.__getitems__([0, 1])  # a batch's fetch (a DataLoader's iter() draws a base seed itself)
    assert torch.equal(torch.rand(3), expected)


def test_several_loaders_are_keyed_apart_and_streams_are_left_alone() -> None:
    stream = DataLoader(Stream())
    seeded = seed_validation_loaders({"a": DataLoader(Augmented()), "b": DataLoader(Augmented()), "s": stream}, 7)
    assert seeded["s"] is stream
    assert values(seeded["a"]) != values(seeded["b"])  # loader 0 and loader 1 draw apart
    assert seed_validation_loaders(None, 7) is None


def test_a_loader_that_cannot_be_rebuilt_validates_as_given_unseeded_with_a_warning() -> None:
    # A batch sampler built outside a Lightning hook: its attributes do not say how to rebuild it.
    dataset = Augmented()
    loader = DataLoader(dataset, batch_sampler=BatchSampler(SequentialSampler(dataset), 2, drop_last=False))
    with pytest.warns(UnseededValidationWarning, match="validation loader 0 .* validates as given, unseeded"):
        assert seed_validation_loaders(loader, 7) is loader
    assert len(values(loader)) == 6


class ShuffledValidation(ResumableDataModule, L.LightningDataModule):
    """A validation loader built outside the hook that returns it (plain Lightning warns that it shuffles)."""

    def __init__(self) -> None:
        super().__init__()
        self.val = DataLoader(Augmented(), batch_size=2, shuffle=True)

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(Augmented(), batch_size=2)

    def val_dataloader(self) -> DataLoader[Any]:
        return self.val


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: torch.Tensor, index: int) -> torch.Tensor:
        return self.layer(batch).sum()

    def validation_step(self, batch: torch.Tensor, index: int) -> None:
        assert isinstance(self.trainer.val_dataloaders.dataset, ValidationSeededDataset)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_shuffled_validation_loader_built_outside_a_hook_keeps_lightnings_warning(tmp_path: Path) -> None:
    trainer = L.Trainer(
        default_root_dir=tmp_path,
        max_epochs=1,
        callbacks=[ResumableDataCallback()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    with pytest.warns(UserWarning, match="val_dataloader`'s sampler has shuffling enabled"):
        trainer.fit(Regression(), datamodule=ShuffledValidation())
