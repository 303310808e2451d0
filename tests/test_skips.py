"""Skipped steps as arithmetic: the ranges a user gives, the holes they become, and a sampler that reads around
them exactly what the stream without them holds elsewhere, on any world size, restored anywhere."""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from lightning_resumable import ResumableDataCallback, ResumableDataModule
from lightning_resumable.core.sampler import ResumableSampler
from lightning_resumable.core.skips import from_stream, plan, position_in_stream
from lightning_resumable.core.step_layout import sampler_layout
from lightning_resumable.errors import SkipError, StateFormatError
from lightning_resumable.format.envelope import Envelope, LoaderState, parse
from lightning_resumable.format.skips import Hole, Skip, StepRange, step_ranges
from lightning_resumable.format.state import DataState

from .helpers import Counting


def test_ranges_are_read_in_every_spelling_and_sorted() -> None:
    assert step_ranges("40701-40900") == (StepRange(40701, 40900),)
    assert step_ranges([40701, 40900]) == (StepRange(40701, 40900),)
    assert step_ranges(["9-10", 3, [5, 6]]) == (StepRange(3, 3), StepRange(5, 6), StepRange(9, 10))
    assert step_ranges("5-6, 1-2") == (StepRange(1, 2), StepRange(5, 6))
    assert step_ranges(None) == ()


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("9-3", "is empty"),
        ("1-5,5-7", "overlap"),
        (["1-4", [3, 8]], "overlap"),
        ("a-b", "must be 'first-last'"),
        (-3, "must be 'first-last'"),
        ([[1, 2, 3]], "must be 'first-last'"),
    ],
)
def test_bad_ranges_are_refused_with_their_cause(given: object, message: str) -> None:
    with pytest.raises(SkipError, match=message):
        step_ranges(given)  # type: ignore[arg-type]


def stream(
    world_size: int, holes: tuple[Hole, ...], epoch: int, size: int = 50, batch: int = 4, seed: int = 3
) -> list[int]:
    """The epoch's global order as the ranks read it, batch by batch, rank after rank."""
    per_rank = []
    for rank in range(world_size):
        sampler = ResumableSampler(range(size), num_replicas=world_size, rank=rank, seed=seed, batch_size=batch)
        sampler.holes = holes
        sampler.set_epoch(epoch)
        per_rank.append(list(sampler))
    return [index for step in zip(*per_rank, strict=False) for index in step]


def test_a_skip_passes_over_the_data_of_its_steps_and_no_other() -> None:
    sampler = ResumableSampler(range(48), num_replicas=2, rank=0, seed=3, batch_size=4, drop_last=True)
    skips = plan(step_ranges("2-3"), sampler_layout(sampler, 0, 1, None))
    assert skips == [Skip(StepRange(2, 3), 2, (Hole(0, 16, 16),))]
    full, skipped = stream(2, (), 0, 48), stream(2, skips[0].holes, 0, 48)
    assert skipped == full[:16] + full[32:]


def test_a_skip_across_an_epochs_end_cuts_the_epoch_and_starts_the_next_after_it() -> None:
    sampler = ResumableSampler(range(48), num_replicas=2, rank=0, seed=3, batch_size=4)
    (skip,) = plan(step_ranges("5-7"), sampler_layout(sampler, 0, 1, None))  # 6 steps an epoch
    assert skip.holes == (Hole(0, 40, 8), Hole(1, 0, 16))
    assert stream(2, skip.holes, 0, 48) == stream(2, (), 0, 48)[:40]
    assert stream(2, skip.holes, 1, 48) == stream(2, (), 1, 48)[16:]


def test_ranges_given_together_count_the_spiking_runs_steps() -> None:
    sampler = ResumableSampler(range(80), num_replicas=1, rank=0, seed=3, batch_size=4)
    first, second = plan(step_ranges("2-3,6-7"), sampler_layout(sampler, 0, 1, None))
    assert (first.at, second.at) == (2, 4)  # the recovered run reaches spiking step 6 at its step 4
    holes = (*first.holes, *second.holes)
    full = stream(1, (), 0, 80)
    assert stream(1, holes, 0, 80) == full[:8] + full[16:24] + full[32:]


def test_accumulation_counts_a_step_as_its_window() -> None:
    sampler = ResumableSampler(range(80), num_replicas=2, rank=0, seed=3, batch_size=2)
    (skip,) = plan(step_ranges("1-1"), sampler_layout(sampler, 0, 3, None))
    assert skip.holes == (Hole(0, 12, 12),)  # step 1 is batches 3, 4 and 5 of 2 ranks and 2 samples


def test_a_range_passing_over_a_whole_epoch_is_refused() -> None:
    sampler = ResumableSampler(range(16), num_replicas=1, rank=0, seed=3, batch_size=4)
    with pytest.raises(SkipError, match="not pass over a whole epoch"):
        plan(step_ranges("2-7"), sampler_layout(sampler, 0, 1, None))


@settings(max_examples=60, deadline=None)
@given(
    world=st.integers(1, 4),
    resumed_world=st.integers(1, 4),
    first=st.integers(0, 5),
    length=st.integers(1, 4),
    cut=st.integers(0, 5),
)
def test_a_restore_anywhere_on_any_world_size_reads_the_rest_around_the_holes(
    world: int, resumed_world: int, first: int, length: int, cut: int
) -> None:
    """The holes are positions, not steps: a state saved on ``world`` ranks resumes on ``resumed_world``
    and the ranks together read the stream's rest, holes out, each position once (drop_last: no padding)."""
    size, batch = 97, 2
    sampler = ResumableSampler(range(size), num_replicas=world, rank=0, seed=5, batch_size=batch, drop_last=True)
    (skip,) = plan([StepRange(first, first + length - 1)], sampler_layout(sampler, 0, 1, None))
    holes = tuple(hole for hole in skip.holes if hole.epoch == 0)
    whole = stream(1, holes, 0, size, 1, seed=5)  # the order itself, on one rank
    sampler.holes = holes
    cut = min(cut, len(sampler) // batch)
    state = sampler.state_dict(cut)
    rest = []
    for rank in range(resumed_world):
        resumed = ResumableSampler(range(size), num_replicas=resumed_world, rank=rank, seed=0, batch_size=batch)
        resumed.drop_last = True
        resumed.holes = holes
        resumed.load_state_dict(state)
        rest.append(list(resumed))
    read = sorted(index for each in rest for index in each)
    position = state["position"]
    expected_rest = whole[position:]
    usable = len(expected_rest) // resumed_world * resumed_world
    assert read == sorted(expected_rest[:usable])


@settings(max_examples=80, deadline=None)
@given(
    world=st.integers(1, 4),
    resumed_world=st.integers(1, 4),
    cut=st.integers(0, 4),
    ahead=st.integers(0, 6),
    length=st.integers(1, 3),
    accumulate=st.integers(1, 2),
)
def test_a_skip_given_at_a_resume_on_another_world_size_is_placed_in_the_steps_the_checkpoint_numbered(
    world: int, resumed_world: int, cut: int, ahead: int, length: int, accumulate: int
) -> None:
    """Issue 53: the steps of a range given at a resume are the steps of the run that wrote the checkpoint: the holes
    are those its own world size plans from the state, and the resumed run reaches the first at the step whose
    batches read its start, on its own world size."""
    size, batch = 61, 2

    def restored(ranks: int) -> ResumableSampler:
        resumed = ResumableSampler(range(size), num_replicas=ranks, rank=0, seed=0, batch_size=batch)
        resumed.load_state_dict(state)
        return resumed

    first_run = ResumableSampler(range(size), num_replicas=world, rank=0, seed=5, batch_size=batch)
    cut = min(cut * accumulate, len(first_run) // batch)
    state = first_run.state_dict(cut)
    step = cut // accumulate
    wanted = StepRange(step + ahead, step + ahead + length - 1)
    try:
        oracle = plan([wanted], sampler_layout(restored(world), step, accumulate, None))
    except SkipError:  # passes over a whole epoch: refused on any world size
        return
    written = DataState.from_dict(state) if world != resumed_world else None
    resumed = restored(resumed_world)
    (skip,) = plan([wanted], sampler_layout(resumed, step, accumulate, None, written))
    assert skip.holes == oracle[0].holes
    resumed.holes = skip.holes
    here = sampler_layout(resumed, step, accumulate, None)
    at = here.step_reading(skip.holes[0])
    epoch, position = skip.holes[0].epoch, skip.holes[0].start
    assert epoch is not None
    if position >= resumed.epoch_length(epoch):  # it takes the epoch's rest: the next epoch's first step is after it
        epoch, position = epoch + 1, 0

    def starts(at_step: int) -> tuple[int, int]:
        placed = here.place(at_step)
        return placed[0], here.position_of(*placed)

    assert starts(at) <= (epoch, position) < starts(at + 1)
    if world == resumed_world:
        assert at == wanted.first


def test_positions_map_to_the_stream_and_back() -> None:
    holes = (Hole(None, 10, 5), Hole(None, 3, 2))  # the second given after the first
    assert [position_in_stream(holes, None, p) for p in (0, 2, 3, 7, 8, 20)] == [0, 2, 5, 9, 15, 27]
    assert [from_stream(holes, None, p) for p in (0, 2, 5, 9, 15, 27)] == [0, 2, 3, 7, 8, 20]


def test_skips_are_recorded_in_the_envelope_and_read_back() -> None:
    from lightning_resumable.format.state import DataState

    state = DataState(
        seed=1, epoch=0, position=8, batches=1, dataset_size=50, shuffle=True, drop_last=False, batch_size=4,
        world_size=2, anchor_position=0, anchor_batches=0, stream_length=50,
    )  # fmt: skip
    skips = (Skip(StepRange(3, 6), 3, (Hole(0, 24, 16), Hole(1, 0, 16))),)
    raw = Envelope(LoaderState(state), skips=skips).to_dict()
    assert parse(raw).skips == skips
    assert "skips" not in Envelope(LoaderState(state)).to_dict()  # a run without skips writes what 0.3.0 wrote
    for damaged in ([], [{"steps": [3, 1], "at": 3, "holes": []}], [{"steps": [1, 2], "at": -1, "holes": []}]):
        with pytest.raises(StateFormatError):
            parse({**raw, "skips": damaged})


def test_ranks_given_different_ranges_are_refused_on_every_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rank gathers every rank's ranges before any step; one that differs is named, on every rank."""
    from lightning_resumable.lightning import skipping

    monkeypatch.setattr(skipping, "all_gather_objects", lambda given: [given, ["3-9"]])
    with pytest.raises(SkipError, match=r"rank 0: 3-6; rank 1: 3-9\): give every rank the same"):
        skipping.SkippedSteps("3-6")._agree()
    monkeypatch.setattr(skipping, "all_gather_objects", lambda given: [given, given])
    skipping.SkippedSteps("3-6")._agree()  # the same everywhere: accepted


def test_batches_names_a_chunked_sources_chunk_for_each_sample() -> None:
    """``batches`` of a mixture gives ``[source, index, chunk]`` for a chunked source (chunks of 4, 4 and 2 samples)
    and ``[source, index]`` for another."""
    from lightning_resumable import Chunked, Mixture
    from lightning_resumable.tools.step_batches import _locator

    mixture = Mixture({"a": Chunked(list(range(10)), [4, 4, 2]), "b": list(range(5))}, {"a": 0.5, "b": 0.5})
    locate = _locator(mixture)
    assert [locate(index) for index in (0, 3, 4, 8, 9)] == [
        ["a", 0, 0],
        ["a", 3, 0],
        ["a", 4, 1],
        ["a", 8, 2],
        ["a", 9, 2],
    ]
    assert locate(10) == ["b", 0]


class _StreamData(ResumableDataModule, L.LightningDataModule):
    def train_dataloader(self) -> Any:
        return DataLoader(Counting(24), batch_size=4)  # 6 batches an epoch


class _Recorder(L.Callback):
    def __init__(self) -> None:
        self.ids: list[list[int]] = []

    def on_train_batch_end(self, trainer: L.Trainer, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.ids.append([int(value) for value in batch[:, 0].tolist()])


class _Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.layer(batch).sum()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.parametrize("reload", [0, 1])
def test_a_streams_discard_cut_by_an_epochs_end_goes_on_in_a_loader_built_again(reload: int) -> None:
    """Steps 4-7 of 6-batch epochs: epoch 0's batches 4 and 5, epoch 1's 0 and 1, read and discarded. With
    ``reload_dataloaders_every_n_epochs=1`` epoch 1 reads a new loader, whose owner is new: the two batches the end
    of epoch 0 cut off are still discarded (they were lost with the last owner)."""
    recorder = _Recorder()
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, reload_dataloaders_every_n_epochs=reload,
        callbacks=[ResumableDataCallback(skip_steps="4-7"), recorder],
    )  # fmt: skip
    trainer.fit(_Model(), _StreamData())
    epoch = [list(range(start, start + 4)) for start in range(0, 24, 4)]
    assert recorder.ids == epoch[:4] + epoch[2:]


class _SeveralLoaders(ResumableDataModule, L.LightningDataModule):
    def train_dataloader(self) -> Any:
        features = torch.randn(24, 2)
        return {"a": DataLoader(features, batch_size=4), "b": DataLoader(features[:8], batch_size=4)}


def test_skipping_several_loaders_is_refused_naming_what_can_be_skipped() -> None:
    """Issue 53: the refusal named only map-style loaders and mixtures; streams and batch samplers are skipped too."""
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[ResumableDataCallback(skip_steps="1-2")],
    )  # fmt: skip
    with pytest.raises(SkipError, match=r"a batch sampler, or a stream.*several loaders; the train input is several"):
        trainer.fit(_Model(), _SeveralLoaders())


class _MapData(ResumableDataModule, L.LightningDataModule):
    def train_dataloader(self) -> Any:
        return DataLoader(torch.randn(24, 2), batch_size=4)  # 6 batches an epoch

    def val_dataloader(self) -> Any:
        return DataLoader(torch.randn(4, 2), batch_size=4)


def test_an_epoch_a_skip_shortens_below_an_integer_val_check_interval_is_lightnings_value_error() -> None:
    """docs/long-runs.md, Limits: steps 1-4 leave epoch 0 two batches, fewer than ``val_check_interval=3``: Lightning
    refuses that epoch at its start (with ``val_check_interval=2`` the same skip trains)."""

    class Validated(_Model):
        def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
            return None

    def fit(interval: int) -> None:
        trainer = L.Trainer(
            accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, val_check_interval=interval,
            num_sanity_val_steps=0, callbacks=[ResumableDataCallback(skip_steps="1-4")],
        )  # fmt: skip
        trainer.fit(Validated(), _MapData())

    fit(2)
    with pytest.raises(ValueError, match="val_check_interval"):
        fit(3)
