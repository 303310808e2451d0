"""Validation samples are drawn under seeds of ``(seed, loader, index)``: the same at every validation,
in workers and in the main process, whatever the global generators held before."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from lightning_resumable.lightning.validation import ValidationSeededDataset, seed_validation_loaders


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
