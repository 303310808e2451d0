"""A worker seeds Python's and NumPy's global generators only while its dataset draws from them, and
every sample is still what it is with all three seeded (the main process's fetch, the reference)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_resumable import SampleSeededDataset
from lightning_resumable.core.watched_globals import WatchedGlobals, seed_generators
from lightning_resumable.readers.build import make_resumable

SIZE = 24


class DrawsNow(Dataset[tuple[int, list[float]]]):
    """Draws from torch's generator always; from Python's only past ``python_from``, NumPy's normal
    (whose second value the legacy generator caches) only at ``numpy_at``."""

    def __init__(self, python_from: int = SIZE, numpy_at: tuple[int, ...] = ()) -> None:
        self.python_from, self.numpy_at = python_from, numpy_at
        self.fetches = 0

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, index: int) -> tuple[int, list[float]]:
        self.fetches += 1
        values = [torch.rand(()).item()]
        if index >= self.python_from:
            values.append(random.random())
        if index in self.numpy_at:
            values.append(float(np.random.standard_normal()))
        return index, values


def collate(samples: list[Any]) -> list[Any]:
    return samples


def samples_of(dataset: Dataset[Any], num_workers: int) -> tuple[list[Any], list[Any]]:
    """What the loader fetches, and the reference: each of its keys fetched with all three generators seeded."""
    user = DataLoader(dataset, batch_size=4, shuffle=True, num_workers=num_workers, collate_fn=collate)
    loader = make_resumable(user, seed=3, num_replicas=1, rank=0)
    samples = [sample for batch in loader for sample in batch]
    every_seeded = SampleSeededDataset(dataset)
    return samples, [every_seeded._fetch_one(index, seed) for index, seed in loader.sampler]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "dataset",
    [DrawsNow(), DrawsNow(python_from=0, numpy_at=tuple(range(SIZE))), DrawsNow(python_from=13, numpy_at=(9, 21))],
    ids=["torch only", "all three always", "Python's and NumPy's now and then"],
)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loader_fetches_what_it_fetches_with_every_generator_seeded(dataset: DrawsNow, num_workers: int) -> None:
    np.random.standard_normal()  # NumPy's generator now caches a normal value (the workers inherit it)
    samples, reference = samples_of(dataset, num_workers)
    assert samples == reference
    assert len({value for _, values in reference for value in values}) == sum(len(v) for _, v in reference)


def fetch_batches(dataset: DrawsNow, batches: int) -> tuple[list[Any], WatchedGlobals]:
    """The batches of 4 a worker would fetch: through `WatchedGlobals`, as a worker's fetch does."""
    seeded, watched = SampleSeededDataset(dataset), WatchedGlobals()
    keys = [(index, index * 7919 + 1) for index in range(batches * 4)]
    samples = [watched.fetch(keys[at : at + 4], seeded._fetch_one) for at in range(0, len(keys), 4)]
    return samples, watched


def test_a_generator_drawn_from_late_costs_one_batch_fetched_twice() -> None:
    dataset = DrawsNow(python_from=13)
    samples, watched = fetch_batches(dataset, batches=6)
    assert watched.python and not watched.numpy
    assert dataset.fetches == 6 * 4 + 4, "batch 3 (samples 12-15) drew from Python's unseeded generator once"
    alike = DrawsNow(python_from=13)
    seeded = SampleSeededDataset(alike)
    assert samples == [
        [seeded._fetch_one(index, index * 7919 + 1) for index in range(at, at + 4)] for at in (0, 4, 8, 12, 16, 20)
    ]


def test_the_first_batch_learns_what_is_drawn_without_fetching_twice() -> None:
    dataset = DrawsNow(python_from=2, numpy_at=(1,))
    _, watched = fetch_batches(dataset, batches=3)
    assert watched.python and watched.numpy
    assert dataset.fetches == 12
    torch_only = DrawsNow()
    _, watched = fetch_batches(torch_only, batches=3)
    assert watched.python is False and watched.numpy is False
    assert torch_only.fetches == 12


def test_a_generator_left_alone_is_not_seeded() -> None:
    _, watched = fetch_batches(DrawsNow(), batches=2)
    random.seed(5)
    before = random.getstate()
    watched.fetch([(0, 11), (1, 12)], SampleSeededDataset(DrawsNow())._fetch_one)
    assert random.getstate() == before
    seed_generators(11)
    assert random.getstate() != before


def test_a_normal_value_cached_before_a_batch_is_not_returned_unseen() -> None:
    dataset = DrawsNow(numpy_at=(9,))
    seeded, watched = SampleSeededDataset(dataset), WatchedGlobals()
    watched.fetch([(0, 1), (1, 2), (2, 3), (3, 4)], seeded._fetch_one)  # none draws from NumPy's: left alone
    assert watched.numpy is False
    np.random.standard_normal()  # the generator now caches the second normal value it computed
    keys = [(8, 5), (9, 6), (10, 7), (11, 8)]
    assert watched.fetch(keys, seeded._fetch_one) == [seeded._fetch_one(index, seed) for index, seed in keys]
    assert watched.numpy is True
