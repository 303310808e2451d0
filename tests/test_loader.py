"""The mixin's loader conversion keeps the user's settings and refuses what it cannot resume exactly."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler, IterableDataset, SequentialSampler
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_resumable import IncompatibleStateError, ResumableSampler, UnsupportedLoaderError
from lightning_resumable.readers.build import make_resumable
from lightning_resumable.readers.workers import WorkerSafeDataLoader


class Squares(Dataset[int]):
    def __len__(self) -> int:
        return 20

    def __getitem__(self, index: int) -> int:
        return index * index


def collate(batch: list[int]) -> torch.Tensor:
    return torch.tensor(batch)


def convert(loader: object) -> DataLoader[Any]:
    return make_resumable(loader, seed=7, num_replicas=2, rank=1)


@pytest.mark.parametrize("loader_type", [DataLoader, StatefulDataLoader])
@pytest.mark.parametrize("shuffle", [True, False])
def test_settings_are_kept_and_the_sampler_replaced(loader_type: type, shuffle: bool) -> None:
    original = loader_type(
        Squares(),
        batch_size=3,
        shuffle=shuffle,
        num_workers=2,
        drop_last=True,
        collate_fn=collate,
        persistent_workers=True,
        prefetch_factor=3,
    )
    converted = convert(original)
    sampler = converted.sampler
    assert type(converted) is WorkerSafeDataLoader and not hasattr(converted, "state_dict")  # no second owner
    assert isinstance(sampler, ResumableSampler)
    assert (sampler.shuffle, sampler.seed, sampler.num_replicas, sampler.rank) == (shuffle, 7, 2, 1)
    assert sampler.batch_size == 3
    assert (converted.batch_size, converted.num_workers, converted.drop_last) == (3, 2, True)
    assert converted.collate_fn is collate
    assert converted.persistent_workers and converted.prefetch_factor == 3


def test_a_loader_with_a_users_resumable_sampler_is_rebuilt_with_its_shuffle() -> None:
    loader = DataLoader(Squares(), batch_size=2, sampler=ResumableSampler(Squares(), 1, 0, shuffle=False))
    converted = convert(loader)
    assert isinstance(converted.sampler, ResumableSampler) and converted.sampler.sample_keys
    assert (converted.sampler.shuffle, converted.sampler.num_replicas, converted.sampler.rank) == (False, 2, 1)


def test_a_converted_loader_is_returned_as_it_is() -> None:
    converted = convert(DataLoader(Squares(), batch_size=2))
    assert convert(converted) is converted


def test_a_distributed_sampler_keeps_its_shuffle() -> None:
    loader = DataLoader(Squares(), batch_size=2, sampler=torch.utils.data.DistributedSampler(Squares(), 2, 0, False))
    assert convert(loader).sampler.shuffle is False  # type: ignore[attr-defined]


class Numbers(IterableDataset[int]):
    def __iter__(self) -> Any:
        return iter(range(5))


class HalfStatefulSquares(Squares):
    def state_dict(self) -> dict[str, int]:
        return {}


class MyStatefulLoader(StatefulDataLoader):
    pass


class TaggedLoader(DataLoader[Any]):
    """A subclass with a required argument that it keeps under another name: only replayable from
    the arguments Lightning records while train_dataloader() runs."""

    def __init__(self, dataset: Any, tag: str, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.label = tag


def test_a_dataloader_subclass_is_built_again_by_its_own_class_with_its_own_arguments() -> None:
    from lightning.fabric.utilities.data import _replace_dunder_methods

    with _replace_dunder_methods(DataLoader, "dataset"):  # what Lightning does around train_dataloader()
        original = TaggedLoader(Squares(), "mine", batch_size=3, shuffle=True, collate_fn=collate)
        converted = convert(original)
    assert type(converted) is TaggedLoader and converted.label == "mine"
    assert isinstance(converted.sampler, ResumableSampler) and converted.sampler.sample_keys
    assert (converted.batch_size, converted.collate_fn) == (3, collate)
    assert converted.dataset.dataset is original.dataset  # type: ignore[attr-defined]
    assert next(iter(converted)).shape == (3,)


@pytest.mark.parametrize(
    ("loader", "message"),
    [
        ([DataLoader(Squares())], "returned a list"),
        (DataLoader(Numbers()), "IterableDataset \\(Numbers\\) without state_dict"),
        (DataLoader(HalfStatefulSquares()), "only one of state_dict/load_state_dict"),
        (DataLoader(Squares(), sampler=[3, 1, 2]), "sampler is a list"),
        (DataLoader(Squares(), batch_sampler=BatchSampler(SequentialSampler(Squares()), 2, False)), "batch_sampler"),
        (TaggedLoader(Squares(), "mine"), r"TaggedLoader, a DataLoader subclass that Lightning cannot build again"),
        (MyStatefulLoader(Squares()), "MyStatefulLoader, a loader with a state_dict of its own"),
    ],
)
def test_unsupported_loaders_are_refused_with_the_reason(loader: object, message: str) -> None:
    with pytest.raises(UnsupportedLoaderError, match=message):
        convert(loader)


class Sized(Dataset[int]):
    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        return index


@pytest.mark.parametrize("drop_last", [False, True])
def test_a_users_distributed_sampler_keeps_its_drop_last(drop_last: bool) -> None:
    dataset = Sized(31)
    for rank in (0, 1):
        theirs = DistributedSampler(dataset, num_replicas=2, rank=rank, shuffle=False, drop_last=drop_last)
        loader = DataLoader(dataset, batch_size=4, sampler=theirs)
        ours = make_resumable(loader, seed=7, num_replicas=2, rank=rank, seed_samples=False)
        ids = [int(i) for batch in ours for i in batch]
        assert ids == list(theirs), "the same samples as torch's sampler: 15 per rank with drop_last, else 16"
        assert len(ids) == (15 if drop_last else 16)


def test_a_resume_with_another_loader_drop_last_is_refused_either_way() -> None:
    def sampler_of(drop_last: bool) -> ResumableSampler:
        loader = DataLoader(Sized(31), batch_size=4, shuffle=True, drop_last=drop_last)
        sampler = make_resumable(loader, seed=7, num_replicas=2, rank=0).sampler
        assert isinstance(sampler, ResumableSampler)
        return sampler

    for saved, resumed in ((False, True), (True, False)):
        state = sampler_of(saved).state_dict()
        with pytest.raises(IncompatibleStateError, match=f"drop_last_batch: checkpoint {saved}, now {resumed}"):
            sampler_of(resumed).load_state_dict(state)
        sampler_of(saved).load_state_dict(state)  # the same setup resumes
        older = {key: value for key, value in state.items() if key != "drop_last_batch"} | {"version": 3}
        sampler_of(resumed).load_state_dict(older)  # version 3 did not record it: nothing to compare
