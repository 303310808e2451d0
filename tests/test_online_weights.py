"""Weights set by the training: the stream, the sampler's read-ahead, the record, and per-source signals.

The end-to-end exactness (a real Trainer, DDP, workers, interruptions) is tests/e2e/test_online_mixing.py's.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_resumable import Mixture, WeightSchedule
from lightning_resumable.core.batch_sources import BatchSources
from lightning_resumable.core.mixture_stream import realise
from lightning_resumable.errors import MixtureError, StateFormatError
from lightning_resumable.format.mixture_state import MixtureRecord, WeightChange
from lightning_resumable.lightning.mixture_owner import MixtureOwner

from .helpers import SIZES, drawn, mixture, owner_for, read_epochs, resumed, save

OLD, NEW, LATER = (
    {"web": 5, "code": 3, "books": 2},
    {"web": 1, "code": 1, "books": 6},
    {"web": 0, "code": 1, "books": 1},
)


def parts_of(weights: dict[str, int]) -> tuple[tuple[tuple[str, int], ...], int]:
    return realise(weights, sorted(SIZES), "")


def fresh(mix: Mixture, batch_size: int = 4) -> MixtureOwner:
    owner = owner_for(mix, batch_size=batch_size)
    owner.start_fresh(0)
    return owner


# ------------------------------------------------------------------------------------ the stream
@settings(max_examples=40, deadline=None)
@given(st.integers(1, 200), st.integers(0, 260), st.booleans())
def test_a_change_added_to_a_stream_draws_as_a_schedule_that_changes_there(
    position: int, known: int, with_later: bool
) -> None:
    """Whatever the stream had worked out already (``known``), a change at a position draws from there as a
    schedule by samples that changes there; a later change of the schedule still applies."""
    changes = {0: OLD, 230: LATER} if with_later else {0: OLD}
    live = fresh(mixture(WeightSchedule(changes, unit="samples"), samples_per_epoch=400)).sampler.stream
    live.indices(torch.arange(known))
    live.add_change(position, *parts_of(NEW))
    expected_schedule = {0: OLD, position: NEW, **({230: LATER} if with_later and position < 230 else {})}
    if with_later and position >= 230:
        expected_schedule = {0: OLD, 230: LATER, position: NEW}
    planned = fresh(mixture(WeightSchedule(expected_schedule, unit="samples"), samples_per_epoch=400)).sampler.stream
    positions = torch.arange(400)
    assert live.indices(positions).tolist() == planned.indices(positions).tolist()


def test_at_one_position_the_training_s_change_wins_over_the_schedule_s() -> None:
    stream = fresh(mixture(WeightSchedule({0: OLD, 40: LATER}, unit="samples"))).sampler.stream
    stream.indices(torch.arange(100))
    stream.add_change(40, *parts_of(NEW))
    assert stream.segment_at(40).weights() == {name: weight for name, weight in realise_weights(NEW).items()}
    assert stream.segment_at(39).weights() == realise_weights(OLD)


def realise_weights(weights: dict[str, int]) -> dict[str, Any]:
    from fractions import Fraction

    parts, period = parts_of(weights)
    return {name: Fraction(part, period) for name, part in parts}


def test_a_change_at_or_before_the_stream_s_start_is_refused() -> None:
    stream = fresh(mixture(OLD)).sampler.stream
    with pytest.raises(ValueError, match="not after the stream's known start"):
        stream.add_change(0, *parts_of(NEW))


# ------------------------------------------------------------------------- the sampler's read-ahead
@pytest.mark.parametrize("read", [0, 3, 9])
def test_a_sampler_changed_midway_hands_out_what_a_schedule_changed_there_would(read: int) -> None:
    """The sampler computes its indices in chunks far ahead; a change where it has not handed out yet
    cuts the chunk there, and the rest is computed with the new weights."""
    owner = fresh(mixture(OLD, samples_per_epoch=60))
    sampler = owner.sampler
    iterator = iter(sampler)
    handed = list(itertools.islice(iterator, read))
    assert sampler.read_before(read) and (read == 0 or not sampler.read_before(read - 1))
    sampler.change_weights(12, *parts_of(NEW))
    keys = handed + list(iterator)
    expected = fresh(mixture(WeightSchedule({0: OLD, 12: NEW}, unit="samples"), samples_per_epoch=60)).sampler
    assert drawn(sampler, keys) == drawn(expected, list(iter(expected)))


def test_a_change_where_the_sampler_handed_out_already_is_refused() -> None:
    sampler = fresh(mixture(OLD, samples_per_epoch=60)).sampler
    iterator = iter(sampler)
    list(itertools.islice(iterator, 13))
    assert not sampler.read_before(12)
    with pytest.raises(ValueError, match="read already"):
        sampler.change_weights(12, *parts_of(NEW))


def test_the_start_of_an_accumulation_window_is_counted_within_each_epoch() -> None:
    """Epochs of 7 batches of 4 samples (28 positions): windows of 3 batches start at batches 0, 3, 6 of
    each epoch, so at positions 0, 12, 24, then 28 (the next epoch), 40, 52, 56."""
    sampler = fresh(mixture(OLD, samples_per_epoch=28)).sampler
    found = [sampler.window_start(position, 3) for position in range(0, 60, 4)]
    assert found == [0, 12, 12, 12, 24, 24, 24, 28, 40, 40, 40, 52, 52, 52, 56]
    assert [sampler.window_start(position, 1) for position in (0, 4, 28)] == [0, 4, 28]


# ------------------------------------------------------------------------------------ the owner
def test_a_change_is_planned_after_the_read_ahead_and_recorded_in_every_later_state() -> None:
    owner = fresh(mixture(OLD, samples_per_epoch=120))
    owner.batch_started(2)
    change, ready = owner.plan_change(NEW, None, read_ahead=3, accumulate=1)
    assert (change.asked, change.step, change.position, ready) == (2, 6, 24, True)
    owner.change(change)
    assert owner.plan_change(NEW, None, read_ahead=3, accumulate=4)[0].step == 8  # the next window of 4
    with pytest.raises(MixtureError, match="step 6 at the earliest"):
        owner.plan_change(NEW, 5, read_ahead=3, accumulate=1)
    with pytest.raises(MixtureError, match="unknown"):
        owner.plan_change({"web": 1, "video": 1}, None, read_ahead=3, accumulate=1)
    assert save(owner, 3).mixture.changes == (change,)


@pytest.mark.parametrize("stop", [2, 5, 9], ids=["before-it-took-effect", "as-it-does", "after"])
def test_a_resume_continues_with_the_changes_the_training_set(stop: int) -> None:
    """Asked at step 1, in effect from step 5 (position 20): a resume before, at or after it reads on as the
    run that was not interrupted, and keeps the history."""

    def run(stop_at: int | None) -> tuple[list[Any], tuple[WeightChange, ...]]:
        owner = fresh(mixture(OLD, samples_per_epoch=60))
        owner.batch_started(1)
        owner.change(owner.plan_change(NEW, None, read_ahead=3, accumulate=1)[0])
        sampler = owner.sampler
        if stop_at is None:
            read = read_epochs(owner, 3)
            return read, save(owner, 0).mixture.changes
        start = drawn(sampler, list(iter(sampler)))[: stop_at * sampler.batch_size]
        again = resumed(mixture(OLD), save(owner, stop_at))
        read = start + read_epochs(again, 3)
        return read, save(again, 0).mixture.changes

    assert run(stop) == run(None)


def test_weights_the_training_set_go_on_at_a_resume_unless_the_schedule_changed() -> None:
    owner = fresh(mixture(OLD, samples_per_epoch=60))
    owner.batch_started(0)
    owner.change(owner.plan_change(NEW, None, read_ahead=1, accumulate=1)[0])  # from step 2
    list(iter(owner.sampler))
    saved = save(owner, 4)
    assert resumed(mixture(OLD), saved).sampler.stream.segment_at(16).weights() == realise_weights(NEW)
    assert resumed(mixture(LATER), saved).sampler.stream.segment_at(16).weights() == realise_weights(LATER)


# ------------------------------------------------------------------------------------ the record
def test_the_record_round_trips_its_changes_and_refuses_altered_ones() -> None:
    change = WeightChange(3, 7, 56, 10, {"web": 5, "code": 5})
    record = MixtureRecord(
        0,
        9,
        56,
        10,
        {"web": 5, "code": 5},
        {"web": 1, "code": 2},
        {"web": 9, "code": 9},
        changes=(change,),
        scheduled=(2, {"web": 1, "code": 1}),
    )
    assert MixtureRecord.from_dict(record.to_dict()) == record
    raw = record.to_dict()
    raw["changes"][0]["step"] = 2  # before it was asked
    with pytest.raises(StateFormatError, match="taking effect after asked"):
        MixtureRecord.from_dict(raw)
    raw = record.to_dict()
    raw["changes"] = [change.to_dict(), change.to_dict()]
    with pytest.raises(StateFormatError, match="not in the order"):
        MixtureRecord.from_dict(raw)
    raw = record.to_dict()
    raw["changes"][0]["weights"]["period"] = 11
    with pytest.raises(StateFormatError, match="do not add up"):
        MixtureRecord.from_dict(raw)


# ------------------------------------------------------------------------------- per-source signals
def test_per_source_totals_and_means() -> None:
    sources = BatchSources(("web", "code", "books"), torch.tensor([0, 2, 0, 0]))
    values = torch.tensor([1.0, 4.0, 3.0, 5.0])
    sums, counts = sources.totals(values)
    assert sums.tolist() == [9.0, 0.0, 4.0] and counts.tolist() == [3, 0, 1]
    assert {name: float(mean) for name, mean in sources.means(values).items()} == {"web": 3.0, "books": 4.0}
    with pytest.raises(ValueError, match="one value per sample"):
        sources.totals(torch.ones(3))


def test_the_sources_of_a_batch_are_those_the_sampler_handed_out() -> None:
    owner = fresh(mixture(OLD, samples_per_epoch=60))
    keys = list(iter(owner.sampler))
    for batch in range(3):
        names = [owner.mixture.names[place] for place in owner.sources_of(batch)]
        assert names == [name for name, _ in drawn(owner.sampler, keys[batch * 4 : batch * 4 + 4])]


def test_inspect_shows_the_history_and_which_change_is_pending(tmp_path: Any) -> None:
    from lightning_resumable.tools.summary import render, summarise

    owner = fresh(mixture(OLD, samples_per_epoch=120))
    owner.batch_started(0)
    owner.change(owner.plan_change(NEW, None, read_ahead=1, accumulate=1)[0])  # asked at 0, from step 2
    owner.change(owner.plan_change(LATER, 4, read_ahead=1, accumulate=1)[0])  # asked at 0, from step 4 as given
    list(iter(owner.sampler))
    state = save(owner, 3)
    envelope = {"format": 1, "kind": "mixture", "keys": 1, "state": state.to_dict()}
    lines = [" ".join(line.split()) for line in render(tmp_path / "x.ckpt", summarise(envelope)).splitlines()]
    assert "weights set by the training 2 changes (asked at step -> drawn from step)" in lines
    assert "change 1 step 0 -> 2: books 0.75, code 0.125, web 0.125" in lines
    assert "change 2 step 0 -> 4: books 0.5, code 0.5 (pending: asked before the save, drawn from after it)" in lines


# ------------------------------------------------------------------------------- agreement across ranks
class _Strategy:
    """A stand-in for a DDP strategy: ``all_gather`` returns what each rank sent (this rank's, then the others')."""

    root_device = torch.device("cpu")

    def __init__(self, others: list[list[int]]) -> None:
        self.others = others

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch.stack([tensor, *(torch.tensor(row) for row in self.others)])


class _Trainer:
    def __init__(self, others: list[list[int]]) -> None:
        self.strategy = _Strategy(others)


def _row(change: WeightChange, ready: bool, names: tuple[str, ...]) -> list[int]:
    return [
        change.asked,
        change.step,
        change.position,
        int(ready),
        change.period,
        *(change.parts.get(n, 0) for n in names),
    ]


def test_ranks_that_set_other_weights_or_at_another_step_are_refused_on_every_rank() -> None:
    from lightning_resumable.errors import WeightsDisagreementError
    from lightning_resumable.lightning.online_weights import agree_on

    names = ("books", "code", "web")
    change = WeightChange(4, 6, 48, 8, {"books": 6, "code": 1, "web": 1})
    agree_on(_Trainer([_row(change, True, names)]), change, True, names, 1)  # the same: agreed
    other_weights = WeightChange(4, 6, 48, 8, {"books": 5, "code": 2, "web": 1})
    with pytest.raises(
        WeightsDisagreementError, match=r"rank 1: asked at step 4, from step 6, \{books: 5/8, code: 2/8"
    ):
        agree_on(_Trainer([_row(other_weights, True, names)]), change, True, names, 1)
    other_step = WeightChange(5, 7, 56, 8, {"books": 6, "code": 1, "web": 1})
    with pytest.raises(WeightsDisagreementError, match="rank 1: asked at step 5"):
        agree_on(_Trainer([_row(other_step, True, names)]), change, True, names, 1)
    with pytest.raises(MixtureError, match=r"rank\(s\) \[1\] read stream position 48"):
        agree_on(_Trainer([_row(change, False, names)]), change, True, names, 1)


def test_the_read_ahead_counts_each_worker_s_prefetch_and_the_trainer_s_batch() -> None:
    from torch.utils.data import DataLoader

    from lightning_resumable.lightning.online_weights import read_ahead

    data = list(range(8))
    assert read_ahead(DataLoader(data)) == 1
    assert read_ahead(DataLoader(data, num_workers=2)) == 5
    assert read_ahead(DataLoader(data, num_workers=3, prefetch_factor=4)) == 13


def test_setting_weights_without_a_mixture_is_refused() -> None:
    from lightning_resumable import ResumableDataCallback

    with pytest.raises(MixtureError, match="needs a fit whose train_dataloader"):
        ResumableDataCallback().set_mixture_weights({"web": 1})
    with pytest.raises(MixtureError, match="needs a batch in training"):
        ResumableDataCallback().batch_sources()


def test_weights_set_every_step_keep_few_segments_and_draw_as_the_schedule_of_those_changes() -> None:
    owner = fresh(mixture(OLD, samples_per_epoch=400))
    iterator, keys, changes = iter(owner.sampler), [], {0: OLD}
    for batch in range(100):
        keys += list(itertools.islice(iterator, 4))
        owner.batch_started(batch)
        weights = (OLD, NEW, LATER)[batch % 3]
        change, ready = owner.plan_change(weights, None, read_ahead=1, accumulate=1)
        assert ready
        owner.change(change)
        changes[change.position] = weights
        assert len(owner.sampler.stream.segments) <= 4, "the segments before the batch in training are dropped"
    expected = fresh(mixture(WeightSchedule(changes, unit="samples"), samples_per_epoch=400)).sampler
    assert drawn(owner.sampler, keys) == drawn(expected, list(iter(expected)))
