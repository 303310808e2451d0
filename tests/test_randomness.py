"""Per-sample randomness depends on (seed, epoch, global position) only; fetching leaves the training RNG alone."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_resumable import NotInSampleFetchError, SampleSeededDataset, sample_rng
from lightning_resumable.core.randomness import seed_training_step, step_seed
from lightning_resumable.readers.build import make_resumable


class Augmenting(Dataset[tuple[int, list[float]]]):
    """Draws its 'augmentation' the way augmentation libraries do: from the three global generators."""

    def __len__(self) -> int:
        return 11

    def __getitem__(self, index: int) -> tuple[int, list[float]]:
        return index, [torch.rand(()).item(), random.random(), float(np.random.rand())]


class ExplicitRng(Dataset[tuple[int, list[float]]]):
    def __len__(self) -> int:
        return 11

    def __getitem__(self, index: int) -> tuple[int, list[float]]:
        rng = sample_rng()
        assert sample_rng() is rng, "one sample, one set of generators"
        return index, [torch.rand((), generator=rng.torch).item(), float(rng.numpy.random())]


def collate(samples: list[Any]) -> list[Any]:
    return samples


def draws_by_position(
    dataset: Dataset[Any], world_size: int, num_workers: int, persistent: bool = False, epochs: int = 2
) -> dict[tuple[int, int], list[float]]:
    """(epoch, global position) -> the sample's draws, over all ranks of a world size."""
    draws: dict[tuple[int, int], list[float]] = {}
    for rank in range(world_size):
        user_loader = DataLoader(
            dataset,
            batch_size=2,
            shuffle=True,
            num_workers=num_workers,
            persistent_workers=persistent,
            collate_fn=collate,
        )
        loader = make_resumable(user_loader, seed=9, num_replicas=world_size, rank=rank)
        for epoch in range(epochs):
            loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
            samples = [sample for batch in loader for sample in batch]
            for step, (_, values) in enumerate(samples):
                draws[(epoch, rank + step * world_size)] = values
    return draws


@pytest.mark.parametrize("dataset_type", [Augmenting, ExplicitRng])
def test_draws_depend_on_the_position_not_on_workers_ranks_or_world_size(dataset_type: type) -> None:
    reference = draws_by_position(dataset_type(), world_size=1, num_workers=0)
    for world_size, workers, persistent in [(2, 0, False), (3, 2, False), (2, 2, True)]:
        other = draws_by_position(dataset_type(), world_size, workers, persistent)
        common = set(reference) & set(other)  # positions past 11 are padding, absent on one rank
        assert len(common) == 22
        assert {p: other[p] for p in common} == {p: reference[p] for p in common}
    values = [v for draws in reference.values() for v in draws]
    assert len(set(values)) == len(values), "every sample and every generator draws differently"


def test_a_fetch_in_the_main_process_leaves_the_training_stream_alone() -> None:
    loader = make_resumable(DataLoader(Augmenting(), batch_size=4, shuffle=True), seed=1, num_replicas=1, rank=0)
    batches = iter(loader)  # creating the iterator draws from torch's generator (the workers' base seed)

    def training_draws() -> list[float]:
        return [torch.rand(()).item(), random.random(), float(np.random.rand())]

    torch.manual_seed(5), random.seed(5), np.random.seed(5)
    undisturbed = training_draws()
    torch.manual_seed(5), random.seed(5), np.random.seed(5)
    next(batches)
    assert training_draws() == undisturbed


def test_with_seeding_off_the_global_generators_are_not_seeded_but_sample_rng_works() -> None:
    def first_batch(dataset: Dataset[Any]) -> Any:
        user_loader = DataLoader(dataset, batch_size=4, shuffle=True, collate_fn=collate)
        return next(iter(make_resumable(user_loader, seed=1, num_replicas=1, rank=0, seed_samples=False)))

    torch.manual_seed(1), random.seed(1), np.random.seed(1)
    first = first_batch(Augmenting())
    assert first_batch(Augmenting()) != first  # drawn from the (advanced) global streams
    assert first_batch(ExplicitRng()) == first_batch(ExplicitRng())


def test_sample_rng_outside_a_fetch_is_refused() -> None:
    with pytest.raises(NotInSampleFetchError, match="outside a sample fetch"):
        sample_rng()
    with pytest.raises(NotInSampleFetchError):
        SampleSeededDataset(ExplicitRng())[3]  # a plain index is passed through, unseeded


def test_the_wrapper_reads_attributes_through_and_keeps_the_length() -> None:
    dataset = Augmenting()
    dataset.classes = ["cat", "dog"]  # type: ignore[attr-defined]
    wrapped = SampleSeededDataset(dataset)
    assert wrapped.classes == ["cat", "dog"]
    assert len(wrapped) == 11 and wrapped.dataset is dataset
    assert wrapped[(3, 42)] == wrapped[(3, 42)] != wrapped[(3, 43)]


def test_step_seeds_depend_on_seed_epoch_and_batch_only() -> None:
    seeds = {step_seed(seed, epoch, batch) for seed in (1, 2) for epoch in range(3) for batch in range(50)}
    assert len(seeds) == 300 and all(0 <= s < 2**63 for s in seeds)
    seed_training_step(7, 1, 4)
    first = [torch.rand(()).item(), random.random(), float(np.random.rand())]
    torch.rand(10), random.random()  # whatever ran in between...
    seed_training_step(7, 1, 4)
    assert [torch.rand(()).item(), random.random(), float(np.random.rand())] == first  # ...is forgotten
