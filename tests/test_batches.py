"""Bring your own order: a ResumableBatchSampler's epochs are split across ranks and resume exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from lightning_resumable import (
    IncompatibleStateError,
    ResumableBatchSampler,
    ResumableDataModule,
    ResumableSampler,
    UnsupportedLoaderError,
)
from lightning_resumable.core.batches import BatchDraws
from lightning_resumable.readers.build import make_resumable

from .helpers import Model, assert_resumes_exactly


class Growing(ResumableBatchSampler):
    """Shuffled batches whose size is 2 + epoch % 2: epochs hold different numbers of batches."""

    def __init__(self, size: int, drop_last: bool = False) -> None:
        super().__init__()
        self.size, self.drop_last, self.calls = size, drop_last, 0

    def epoch_batches(self, epoch: int, generator: torch.Generator) -> list[list[int]]:
        self.calls += 1
        order = torch.randperm(self.size, generator=generator).tolist()
        width = 2 + epoch % 2
        return [order[start : start + width] for start in range(0, self.size, width)]


class OutOfRange(Growing):
    def epoch_batches(self, epoch: int, generator: torch.Generator) -> list[list[int]]:
        return [[0, self.size]]


def loader_for(batch_sampler: ResumableBatchSampler, world_size: int, rank: int) -> DataLoader[Any]:
    user_loader = DataLoader(range(11), batch_sampler=batch_sampler, collate_fn=lambda samples: samples)
    return make_resumable(user_loader, seed=4, num_replicas=world_size, rank=rank)


def test_rank_r_takes_global_batches_r_r_plus_w_and_every_rank_runs_as_many_steps() -> None:
    global_batches = BatchDraws(Growing(11), 11).batches(4, 0)  # 6 batches of 2, the last of 1
    for drop_last, expected_steps in [(False, 2), (True, 1)]:
        per_rank = [list(loader_for(Growing(11, drop_last), 4, rank)) for rank in range(4)]
        assert {len(steps) for steps in per_rank} == {expected_steps}
        for rank, steps in enumerate(per_rank):
            for step, batch in enumerate(steps):
                position = (rank + 4 * step) % len(global_batches)  # padding wraps to the first batches
                assert batch == global_batches[position]


def test_each_epochs_batches_are_computed_once() -> None:
    batch_sampler = Growing(11)
    loader = loader_for(batch_sampler, 2, 0)
    for epoch in range(2):
        loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        assert len(list(loader)) == len(loader)
    assert batch_sampler.calls == 2


@settings(max_examples=60, deadline=None)
@given(
    world_size=st.integers(1, 4), new_world_size=st.integers(1, 4), fraction=st.floats(0, 0.99), epoch=st.integers(0, 3)
)
def test_a_restore_at_any_batch_continues_the_global_batch_stream_on_any_world_size(
    world_size: int, new_world_size: int, fraction: float, epoch: int
) -> None:
    global_batches = BatchDraws(Growing(11), 11).batches(4, epoch)
    writer: ResumableSampler = loader_for(Growing(11), world_size, 0).sampler  # type: ignore[assignment]
    writer.set_epoch(epoch)
    state = writer.state_dict(int(fraction * len(writer)))
    rest: dict[int, list[int]] = {}
    for rank in range(new_world_size):
        restored: ResumableSampler = loader_for(Growing(11), new_world_size, rank).sampler  # type: ignore[assignment]
        restored.load_state_dict(state)
        for step, keys in enumerate(restored):
            rest.setdefault(state["position"] + rank + step * new_world_size, [index for index, _ in keys])
    assert [rest[p] for p in range(state["position"], len(global_batches))] == global_batches[state["position"] :]


def test_a_batch_outside_the_dataset_is_refused() -> None:
    with pytest.raises(UnsupportedLoaderError, match=r"OutOfRange.epoch_batches\(0\) returned a batch"):
        list(loader_for(OutOfRange(11), 1, 0))


def test_a_checkpoint_of_another_batch_sampler_is_refused() -> None:
    state = loader_for(Growing(11), 1, 0).sampler.state_dict()  # type: ignore[attr-defined]
    with pytest.raises(IncompatibleStateError, match=r"batch-sampler\(Growing\)', now 'batch-sampler\(OutOfRange\)"):
        loader_for(OutOfRange(11), 1, 0).sampler.load_state_dict(state)  # type: ignore[attr-defined]


class GrowingData(ResumableDataModule, L.LightningDataModule):
    def train_dataloader(self) -> DataLoader[Any]:
        rows = torch.arange(11.0).unsqueeze(1)
        return DataLoader(rows, batch_sampler=Growing(11))  # type: ignore[arg-type]


class Recording(Model):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen.append((self.current_epoch, batch.flatten().int().tolist()))
        return self.layer(batch).mean()


def test_epochs_of_different_lengths_are_trained_whole_and_resume_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PL_GLOBAL_SEED", "3")  # the same order in every run, as seed_everything gives
    full = assert_resumes_exactly(tmp_path, Recording, GrowingData, stop=8, max_epochs=3)
    assert [sum(epoch == e for epoch, _ in full) for e in range(3)] == [6, 4, 6]
