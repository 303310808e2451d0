"""The owner of a `Mixture`'s loader: its position, and where each source and the weights stand.

Promise: a resume continues the checkpoint's stream at its stream position. What was trained before
is the checkpoint's; from the resume on the weights are the mixture's schedule's. If they are the
weights in force at the save, the interleave goes on as if uninterrupted; if not, it starts afresh
there, as a run whose schedule changed at that point would (the weights change at a resume, or the
schedule was edited). Every source continues its pass from its count; a source new to the run starts
its first pass; a source no longer in the mixture keeps its count and size in every later state, to
continue its pass if it comes back. A source whose size changed, another ``samples_per_epoch`` or
``shuffle``, is refused, naming it. The first batch after a resume is verified as the checkpoint's
weights would have drawn it (the data must not have changed); the new weights draw from there on.

Weights set by the training (`MixtureOwner.change`) take effect after the loader's read-ahead, at a
position no rank has read yet; each change is recorded in every later state, and a change asked
before a save that takes effect after it does so on the resume too. Weights in force that the
training set go on at a resume unless the schedule's weights there differ from those at the save
(the config changed: then the schedule's, as above).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from lightning_resumable.core.mixture_sampler import MixtureSampler
from lightning_resumable.core.mixture_stream import MixtureStream, Segment, realise
from lightning_resumable.core.schedule import StepClock
from lightning_resumable.core.skips import position_in_stream
from lightning_resumable.errors import IncompatibleStateError, MixtureError
from lightning_resumable.format.envelope import LoaderState, MixtureRecord, MixtureState
from lightning_resumable.format.mixture_state import WeightChange
from lightning_resumable.format.skips import Hole, Skip, StepRange
from lightning_resumable.lightning.owners import LoaderOwner, Owner
from lightning_resumable.lightning.progress import SavePoint
from lightning_resumable.lightning.world_size import WorldSizePolicy

__all__ = ["MixtureOwner"]


class MixtureOwner(Owner[MixtureState]):
    """A `Mixture`'s loader: a map-style loader (`LoaderOwner`) whose sampler reads the mixture's stream."""

    state_type = MixtureState

    def __init__(self, loader: DataLoader[Any]) -> None:
        self.one = LoaderOwner(loader)
        sampler = loader.sampler
        assert isinstance(sampler, MixtureSampler)
        self.sampler, self.mixture = sampler, sampler.mixture
        self.sizes = dict(zip(self.mixture.names, self.mixture.sizes, strict=True))  # removed sources' too
        self.chunks = {name: chunks.digest() for name, chunks in self.mixture.chunks.items()}  # likewise
        self.verified: MixtureStream | None = None  # what the first batch is verified with, if not the training stream
        self.changes: list[WeightChange] = []  # the weights the training set, in the order they take effect
        self.training_at: int | None = None  # the stream position of the batch in training (or last trained)
        self.training_batch: int | None = None  # and its number in the current epoch (the trainer's count)

    @property
    def first_sampler(self) -> MixtureSampler:
        return self.sampler

    def restore(self, saved: MixtureState, epoch: int, verify: bool, world_size_policy: WorldSizePolicy) -> None:
        record, state = saved.mixture, saved.loader.state
        self._refuse_another_setup(saved)
        self.sampler.set_samples_per_epoch(state.dataset_size)
        self.chunks = {**{name: record.chunks[name] for name in record.chunks if name not in self.sizes}, **self.chunks}
        self.sizes = {**record.sizes, **self.sizes}
        position = position_in_stream(self.sampler.holes, None, saved.position)  # the run's skipped data counted
        history = Segment(
            record.segment_start,
            record.period,
            tuple(sorted(record.parts.items())),
            tuple(sorted({**dict.fromkeys(self.sizes, 0), **record.counts}.items())),  # a new source: 0 drawn
        )
        clock = StepClock(position, record.steps, self.sampler.batch_size * self.sampler.num_replicas)
        schedule = self.mixture.schedule
        point = clock.point_at(position, schedule.unit)
        parts, period = realise(
            schedule.weights_at(point), self.mixture.names, f"at the resume ({schedule.unit} {point})"
        )
        self.verified, self.changes, self.training_at = None, list(record.changes), None
        self.training_batch = None
        scheduled = record.scheduled or (record.period, record.parts)  # what the schedule said at the save
        if (period, dict(parts)) == scheduled or history.same_weights(parts, period):
            training = self.sampler.make_stream(history, clock, position)
        else:
            counts = tuple(sorted(history.counts_at(position).items()))
            training = self.sampler.make_stream(Segment(position, period, parts, counts), clock, position)
            rank_zero_info(
                f"lightning_resumable: the mixture's weights change at the resume, stream position {position:,}:"
                f" {_shown(history.weights())} -> {_shown(training.first.weights())}"
            )
            if all(name in self.mixture.names for name, _ in history.parts):
                self.verified = self.sampler.make_stream(history, clock, position, scheduled=False)
        for change in self.changes:  # asked before the save, taking effect after it
            if change.position > position:
                for stream in (training, self.verified):
                    if stream is not None:
                        stream.add_change(change.position, tuple(sorted(change.parts.items())), change.period)
        self.sampler.start_at(state.epoch, record.epoch_start, training)
        self.one.restore(saved.loader, epoch, verify, world_size_policy)
        if training.first is not history:  # the first batch the loader produces is drawn with the new weights
            owned = self.one.owned
            owned.verifying_produced = False
            owned.produced.expect_first((0, 0, 0), "")
            if self.verified is None and owned.to_verify is not None:
                owned.to_verify = None
                rank_zero_info("lightning_resumable: a source drawn before the resume is removed; it is not verified")

    def _refuse_another_setup(self, saved: MixtureState) -> None:
        record, state, mixture = saved.mixture, saved.loader.state, self.mixture
        differences = [
            f"the source {name!r}: size {size:,} in the checkpoint, {self.sizes[name]:,} now (its pass would"
            " continue at other samples)"
            for name, size in sorted(record.sizes.items())
            if name in self.sizes and self.sizes[name] != size
        ]
        differences += [
            f"the source {name!r}: read {_layout(record.chunks.get(name))} in the checkpoint,"
            f" {_layout(self.chunks.get(name))} now (its pass would continue in another order)"
            for name in sorted(record.sizes)
            if name in self.sizes and record.chunks.get(name) != self.chunks.get(name)
        ]
        if mixture.samples_per_epoch is not None and mixture.samples_per_epoch != state.dataset_size:
            differences.append(f"samples_per_epoch: {state.dataset_size:,} in the checkpoint, {len(mixture):,} now")
        if mixture.shuffle != state.shuffle:
            differences.append(f"shuffle: {state.shuffle} in the checkpoint, {mixture.shuffle} now")
        if differences:
            raise IncompatibleStateError(
                "the checkpoint's mixture was written by a different setup; resuming would read other samples."
                " Differences: " + "; ".join(differences)
            )

    def carried(self, epoch: int) -> MixtureState:
        """The state at the start of ``epoch`` (this one or the next), for the loader built again within the
        run (a reload): a new loader's stream continues this one's."""
        return self._state_of(LoaderState(self.sampler.state_at_start(epoch, 0)))

    def start_fresh(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def save(self, at: SavePoint) -> MixtureState:
        return self._state_of(self.one.save(at))

    def _state_of(self, loader: LoaderState) -> MixtureState:
        state, stream = loader.state, self.sampler.stream
        epoch_start = self.sampler.epoch_start(state.epoch)
        position = position_in_stream(self.sampler.holes, None, epoch_start + state.position)
        segment = stream.segment_at(position)
        scheduled = None
        if self.changes:
            schedule = self.mixture.schedule
            parts, period = realise(
                schedule.weights_at(stream.clock.point_at(position, schedule.unit)), self.mixture.names, ""
            )
            scheduled = (period, dict(parts))
        record = MixtureRecord(
            epoch_start=epoch_start,
            steps=stream.clock.point_at(position, "steps"),
            segment_start=segment.start,
            period=segment.period,
            parts=dict(segment.parts),
            counts=dict(segment.counts),
            sizes=dict(self.sizes),
            chunks=dict(self.chunks),
            changes=tuple(self.changes),
            scheduled=scheduled,
        )
        return MixtureState(loader, record)

    # ------------------------------------------------------------- weights set by the training
    def batch_started(self, batch: int) -> None:
        """The trainer begins batch ``batch`` of the current epoch (its count)."""
        self.training_at, self.training_batch = self.sampler.batch_position(batch), batch

    def plan_change(
        self, weights: Any, at_step: int | None, read_ahead: int, accumulate: int
    ) -> tuple[WeightChange, bool]:
        """The change ``weights`` asked now would be, and whether this rank has read nothing where it takes effect.

        It is asked at the step in training (or the last trained, ``-1`` before the run's first) and
        takes effect ``read_ahead + 1`` steps later, at the start of the next accumulation window of
        ``accumulate`` batches from there; or at ``at_step``, which may not be earlier.

        Raises:
            MixtureError: malformed weights; an ``at_step`` within the read-ahead.
        """
        sampler, clock = self.sampler, self.sampler.stream.clock
        if self.training_at is not None:
            asked = clock.point_at(self.training_at, "steps")
        else:  # before this fit's first batch (a validation a resume runs first, say): after the last trained
            asked = clock.point_at(sampler.batch_position(sampler.first_batch), "steps") - 1
        parts, period = realise(weights, self.mixture.names, f"set at step {asked}")
        position = sampler.window_start(clock.position_of(asked + 1 + read_ahead, "steps"), accumulate)
        if at_step is not None:
            if type(at_step) is not int or at_step < asked + 1 + read_ahead:
                raise MixtureError(
                    f"weights asked at step {asked} can take effect at step {asked + 1 + read_ahead} at the earliest"
                    f" (the loader reads {read_ahead} batches ahead), not at_step={at_step!r}"
                )
            position = clock.position_of(at_step, "steps")
        change = WeightChange(asked, clock.point_at(position, "steps"), position, period, dict(parts))
        return change, sampler.read_before(position)

    def change(self, change: WeightChange) -> None:
        """Draw ``change``'s weights from its position on, and record it."""
        before = self.sampler.stream.segment_at(change.position - 1).weights()
        self.sampler.change_weights(change.position, tuple(sorted(change.parts.items())), change.period)
        if self.training_at is not None:  # nothing before the batch in training is read again
            self.sampler.stream.forget_before(self.training_at)
        self.changes = [each for each in self.changes if each.position < change.position] + [change]
        rank_zero_info(
            f"lightning_resumable: the mixture's weights asked at step {change.asked} take effect at step"
            f" {change.step} (stream position {change.position:,}): {_shown(before)} -> {_shown(change.weights())}"
        )

    def weights_of(self, batch: int) -> dict[str, str]:
        """The weights this rank's batch ``batch`` of the current epoch was drawn under (at its first sample)."""
        position = self.sampler.batch_position(batch) + self.sampler.rank * self.sampler.batch_size
        return {
            name: str(weight) for name, weight in sorted(self.sampler.stream.segment_at(position).weights().items())
        }

    def sources_of(self, batch: int) -> list[int]:
        """The source (its place in the mixture's names) of each sample of this rank's batch ``batch``."""
        return [bisect.bisect_right(self.mixture.offsets, index) - 1 for index in self.sampler.batch_indices(batch)]

    @property
    def rebuild_now(self) -> bool:  # type: ignore[override]  # the loader owner's
        return self.one.rebuild_now

    def start(self, trainer: pl.Trainer, batches: int) -> int:
        if self.verified is None:
            return self.one.start(trainer, batches)
        # The next batches are fetched again as the checkpoint's weights draw them (the data must be the
        # same); the loader, whose workers may have read ahead already, reads the new weights' stream.
        training, self.sampler.stream, self.verified = self.sampler.stream, self.verified, None
        try:
            return self.one.start(trainer, batches)
        finally:
            self.sampler.stream = training

    def check_first_batch(self) -> None:
        self.one.check_first_batch()

    def trained_ids(self, batch: Any, batch_idx: int) -> list[list[Any]]:
        """Each sample's source and index in it, ``[name, index]``."""
        return [list(self.mixture.locate(index)) for index in self.sampler.batch_indices(batch_idx)]

    def rebuild_at_epoch_end(self, epoch: int) -> bool:
        return self.one.rebuild_at_epoch_end(epoch)

    def retire_workers(self) -> None:
        self.one.retire_workers()

    def set_holes(self, holes: tuple[Hole, ...]) -> None:
        self.sampler.holes = holes

    def plan_skips(
        self, ranges: Sequence[StepRange], step: int, accumulate: int, limit: int | float | None
    ) -> list[Skip]:
        return self.one.plan_skips(ranges, step, accumulate, limit)

    def reached_at(
        self, skips: tuple[Skip, ...], step: int, accumulate: int, limit: int | float | None
    ) -> tuple[Skip, ...]:
        return self.one.reached_at(skips, step, accumulate, limit)

    def skip_verification(self) -> None:
        self.one.skip_verification()
        self.verified = None


def _layout(digest: str | None) -> str:
    return "by one permutation of its samples" if digest is None else f"chunk by chunk (chunks x window: {digest})"


def _shown(weights: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{name}: {float(weight):.4g}" for name, weight in sorted(weights.items())) + "}"
