"""torchdata's end-of-epoch tests (``test_state_dict.py``: ``TestEndOfEpochBehavior``,
``TestMultiEpochSDL``), ported to `ResumableSampler` inside a user's ``StatefulDataLoader``, with the
``set_epoch`` loops torchdata's samplers have no counterpart for.

torchdata tells apart two states taken at an epoch's end: one after its last batch, before the
iterator ran out (``_iterator_finished`` false), restores to an empty pass; one after it ran out
restores to a fresh pass. Each test compares with the same loop run without an interruption.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_resumable import ResumableSampler

SIZE = 24
LOADER_TIMEOUT_S = 60  # a worker that never answers fails the test (and its workers are shut down)
CASES = list(itertools.product([0, 2], [False, True], [1, 5]))  # workers, shuffle, batch size


def make_loader(num_workers: int, shuffle: bool, batch_size: int, world_size: int = 1) -> StatefulDataLoader:
    data = list(range(SIZE))
    sampler = ResumableSampler(data, world_size, 0, shuffle=shuffle, seed=11, batch_size=batch_size)
    return StatefulDataLoader(
        data,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        timeout=LOADER_TIMEOUT_S if num_workers else 0,
    )


def ids(batches: Iterator[Any]) -> list[list[int]]:
    return [batch.tolist() for batch in batches]


@pytest.mark.parametrize(("num_workers", "shuffle", "batch_size"), CASES)
def test_a_state_after_the_last_batch_restores_to_an_empty_pass_and_one_after_the_end_to_a_full_one(
    num_workers: int, shuffle: bool, batch_size: int
) -> None:
    loader = make_loader(num_workers, shuffle, batch_size)
    epoch = []
    for batch in loader:
        epoch.append(batch.tolist())
        after_last_batch = loader.state_dict()  # the iterator has not run out yet
    after_the_end = loader.state_dict()
    assert after_last_batch["_iterator_finished"] is False and after_the_end["_iterator_finished"] is True

    resumed = make_loader(num_workers, shuffle, batch_size)
    resumed.load_state_dict(after_last_batch)
    assert ids(iter(resumed)) == [], "the rest of the epoch is nothing"
    assert ids(iter(resumed)) == epoch, "the pass after it repeats the epoch, as DistributedSampler's does"

    resumed = make_loader(num_workers, shuffle, batch_size)
    resumed.load_state_dict(after_the_end)
    assert ids(iter(resumed)) == epoch, "an iterator that had run out: torchdata starts a fresh pass"


@pytest.mark.parametrize(("num_workers", "shuffle", "batch_size"), CASES)
@pytest.mark.parametrize("set_epoch", [False, True])
def test_a_loop_resumed_between_epochs_trains_the_uninterrupted_epochs(
    num_workers: int, shuffle: bool, batch_size: int, set_epoch: bool
) -> None:
    def train(loader: StatefulDataLoader, epochs: range) -> list[tuple[int, list[int]]]:
        trained = []
        for epoch in epochs:
            if set_epoch:
                loader.sampler.set_epoch(epoch)
            trained += [(epoch, batch) for batch in ids(iter(loader))]
        return trained

    uninterrupted = train(make_loader(num_workers, shuffle, batch_size), range(4))
    stopped = make_loader(num_workers, shuffle, batch_size)
    first_half = train(stopped, range(2))
    resumed = make_loader(num_workers, shuffle, batch_size)
    resumed.load_state_dict(stopped.state_dict())  # after the iterator of epoch 1 ran out
    assert first_half + train(resumed, range(2, 4)) == uninterrupted
    if set_epoch:
        assert uninterrupted[0][1] != uninterrupted[-1][1] or not shuffle, "the epochs differ: the test can fail"


@pytest.mark.parametrize(("num_workers", "shuffle", "batch_size"), CASES)
@pytest.mark.parametrize("next_epoch_from", ["saved epoch", "saved epoch + 1"])
def test_a_loop_resumed_after_an_epochs_last_batch_goes_on_with_the_next_epoch(
    num_workers: int, shuffle: bool, batch_size: int, next_epoch_from: str
) -> None:
    """A loop that checkpoints after every batch and stops after epoch 0's last one, then resumes at the
    state's epoch (whose rest is nothing) or at the one after it."""

    def epoch_of(loader: StatefulDataLoader, epoch: int) -> list[list[int]]:
        loader.sampler.set_epoch(epoch)
        return ids(iter(loader))

    uninterrupted = make_loader(num_workers, shuffle, batch_size)
    expected = [epoch_of(uninterrupted, epoch) for epoch in range(3)]
    stopped = make_loader(num_workers, shuffle, batch_size)
    stopped.sampler.set_epoch(0)
    for _ in stopped:
        state = stopped.state_dict()
    resumed = make_loader(num_workers, shuffle, batch_size)
    resumed.load_state_dict(state)
    if next_epoch_from == "saved epoch":
        assert epoch_of(resumed, 0) == [], "epoch 0 was trained to its end"
    assert [epoch_of(resumed, epoch) for epoch in (1, 2)] == expected[1:]


def test_a_sampler_restored_from_a_complete_state_alone_yields_its_empty_rest_then_the_pass_after_it() -> None:
    """Without torchdata's loader state a complete epoch's state restores, as torchdata's
    StatefulDistributedSampler does, to the epoch's empty rest; the pass after it is the next one."""
    sampler = ResumableSampler(list(range(10)), 2, 1, seed=3, batch_size=2)
    epoch = list(sampler)
    state = sampler.state_dict(3)  # 5 samples a rank: the last batch has one
    restored = ResumableSampler(list(range(10)), 2, 1, seed=0, batch_size=2)
    restored.load_state_dict(state)
    assert list(restored) == []
    assert list(restored) == epoch
    restored.load_state_dict(state)
    restored.set_epoch(1)  # the next epoch: the restore of a complete epoch is not needed
    fresh = ResumableSampler(list(range(10)), 2, 1, seed=3, batch_size=2)
    fresh.set_epoch(1)
    assert list(restored) == list(fresh) != epoch


def test_a_pass_restored_at_an_epochs_end_is_empty_and_a_pass_made_instead_of_it_follows_it() -> None:
    """torchdata's protocol, as its loader uses it: the sampler, then the pass it makes at once."""
    for passes, expected_after in (("repeat", "the epoch again"), ("cycle", "the next cycle"), ("once", "nothing")):
        sampler = ResumableSampler(list(range(12)), 1, 0, seed=3, batch_size=3, passes=passes)  # type: ignore[arg-type]
        first, second = list(sampler), list(sampler)
        state = {**sampler.state_dict(), "cycle": 0}  # the end of the first pass
        restored = ResumableSampler(list(range(12)), 1, 0, seed=3, batch_size=3, passes=passes)  # type: ignore[arg-type]
        restored.load_state_dict(state)
        used = iter(restored)
        used.load_state_dict(state)
        after = [] if passes == "once" else second  # a fresh sampler's second pass reads a once-read epoch again
        assert list(used) == [] and list(restored) == after, expected_after
        restored.load_state_dict(state)
        dropped = iter(restored)
        dropped.load_state_dict(state)
        assert list(iter(restored)) == after, expected_after
        assert (second == first) == (passes in ("repeat", "once"))


def test_a_complete_epoch_restored_into_a_sampler_set_to_the_next_one_restores_only_the_seed() -> None:
    """torchdata restores at the first iter(), after a loop's set_epoch of the next epoch."""
    sampler = ResumableSampler(list(range(10)), 1, 0, seed=3, batch_size=2)
    list(sampler)
    state = sampler.state_dict()  # the end of epoch 0
    restored = ResumableSampler(list(range(10)), 1, 0, seed=0, batch_size=2)
    restored.set_epoch(1)
    restored.load_state_dict(state)
    sampler.set_epoch(1)
    assert (restored.epoch, restored.seed, list(restored)) == (1, 3, list(sampler))
    restored.set_epoch(2)
    restored.load_state_dict({**state, "position": 4, "batches": 2})  # not complete: the restore applies
    assert restored.epoch == 0
