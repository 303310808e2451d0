"""Fabric calls ``sampler.set_epoch(passes so far)`` on every pass of a loader it set up: a restore
must not be dropped silently by it, and `restore_loader` makes the resumed passes exact."""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
from torch.utils.data import DataLoader

from lightning_resumable import PendingRestoreError, ResumableSampler
from lightning_resumable.lightning.fabric import loader_state, restore_loader

EPOCHS, BATCH_SIZE = 3, 4


def fabric_loader() -> Any:
    fabric = L.Fabric(accelerator="cpu", devices=1)
    dataset = list(range(22))  # 6 batches an epoch, the last one partial
    sampler = ResumableSampler(dataset, num_replicas=1, rank=0, seed=5, batch_size=BATCH_SIZE)
    return fabric.setup_dataloaders(DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler))


def run(loader: Any, start: tuple[int, int] = (0, 0), stop: tuple[int, int] | None = None) -> list[Any]:
    """(epoch, batch, ids) of each step from ``start``; with ``stop``, the state after that many batches."""
    trained: list[Any] = []
    epoch, first = start
    for epoch in range(start[0], EPOCHS):
        for batch_idx, ids in enumerate(loader, start=first):
            trained.append((epoch, batch_idx, ids.tolist()))
            if (epoch, batch_idx + 1) == stop:
                return [*trained, loader_state(loader, batch_idx + 1)]
        first = 0
    return trained


@pytest.mark.parametrize("stop", [(1, 2), (0, 6), (2, 1)], ids=["mid-epoch", "epoch end", "last epoch"])
def test_a_fabric_loop_restored_with_restore_loader_trains_what_the_uninterrupted_one_did(
    stop: tuple[int, int],
) -> None:
    full = run(fabric_loader())
    *stopped, state = run(fabric_loader(), stop=stop)
    loader = fabric_loader()
    start = restore_loader(loader, state)
    assert start == ((stop[0] + 1, 0) if stop[1] == 6 else stop)
    assert stopped + run(loader, start) == full


def test_a_plain_restore_under_fabric_is_refused_not_dropped() -> None:
    """Fabric's first pass in a new process calls set_epoch(0): before, it silently replayed epoch 0."""
    *_, state = run(fabric_loader(), stop=(1, 2))
    loader = fabric_loader()
    loader.sampler.load_state_dict(state)
    with pytest.raises(PendingRestoreError, match=r"set_epoch\(0\) after a restore of epoch 1 .*restore_loader"):
        next(iter(loader))


def test_set_epoch_keeps_working_as_distributed_samplers_around_a_restore() -> None:
    sampler = ResumableSampler(list(range(8)), num_replicas=1, rank=0, seed=1, batch_size=2)
    sampler.set_epoch(2)
    state = sampler.state_dict(1)
    sampler.load_state_dict(state)
    sampler.set_epoch(2)  # the restored epoch: kept
    assert len(list(sampler)) == 6
    sampler.set_epoch(0)  # after the restored pass began: an ordinary epoch change
    assert len(list(sampler)) == 8
    complete = sampler.state_dict(4)
    sampler.load_state_dict(complete)
    sampler.set_epoch(1)  # a complete epoch 0 goes on with epoch 1
    assert len(list(sampler)) == 8


def test_loader_state_needs_a_resumable_sampler() -> None:
    from lightning_resumable import UnsupportedLoaderError

    with pytest.raises(UnsupportedLoaderError, match="ResumableSampler"):
        loader_state(DataLoader(list(range(4))), 1)
