"""Where the trained data stands in Lightning's loop: the epoch's batch index as the data counts it,
where a checkpoint is written (`SavePoint`), whether a save falls inside a gradient accumulation
window, and the refusal of a checkpoint whose data position is lost."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_warn

from lightning_resumable.errors import MissingStateError, PartialAccumulationError
from lightning_resumable.format.envelope import PartialAccumulation, holds_no_state, parse
from lightning_resumable.internals._lightning import (
    batches_fetched_before,
    epoch_of_trained_batches,
    resumes_in_next_epoch,
    validates_by_time,
    validation_follows,
)

__all__ = [
    "BatchCount",
    "SavePoint",
    "ends_its_epoch_by_count",
    "partial_accumulation",
    "refuse_missing_state",
    "refuse_partial_accumulation",
    "runs_before_next_step",
]


@dataclass(frozen=True)
class SavePoint:
    """Where a checkpoint is being written, as the callback counts it.

    ``collective``: every rank saves in step (a ``ModelCheckpoint``), so they may exchange their
    parts; ``False`` on an exception or signal path, where no rank may wait for another.
    ``complete``: the epoch's batches are all trained; ``next_epoch``: and Lightning's loop resumes
    in the next epoch (else it first ends this one, and the state says this epoch, complete).
    """

    seed: int
    epoch: int
    batches: int
    complete: bool
    next_epoch: bool
    rank: int
    world_size: int
    collective: bool
    verify: bool

    @classmethod
    def of(cls, trainer: pl.Trainer, seed: int, batches: int, collective: bool, verify: bool) -> SavePoint:
        """The save after ``batches`` batches of the trainer's epoch."""
        complete = batches >= trainer.num_training_batches
        return cls(
            seed=seed,
            epoch=epoch_of_trained_batches(trainer),
            batches=batches,
            complete=complete,
            next_epoch=complete and resumes_in_next_epoch(trainer),
            rank=trainer.global_rank,
            world_size=trainer.world_size,
            collective=collective,
            verify=verify,
        )


class BatchCount:
    """The epoch's batch index as the data counts it: Lightning's ``batch_idx``, checked at the first
    resumed batch against where the data resumes, and corrected from then on where they disagree.

    Lightning 2.6 can number a resumed epoch's batches from 0 (a resume from a checkpoint written
    after an earlier resume from an epoch's end) or from where the previous epoch ended (a stream
    resumed after its last batch).
    """

    def __init__(self) -> None:
        self.first: tuple[int, int] | None = None  # (epoch, index of the first batch the data trains)
        self.offset: tuple[int, int] | None = None  # (epoch, data's index minus Lightning's)

    def at_batch_start(self, epoch: int, batch_idx: int) -> int:
        if self.first is not None:
            (first_epoch, expected), self.first = self.first, None
            if first_epoch == epoch and expected != batch_idx:
                rank_zero_warn(
                    f"lightning_resumable: the data resumes at batch {expected} of epoch {epoch}, but Lightning"
                    f" numbers that batch {batch_idx}; its loop progress in the checkpoint is inconsistent (as after"
                    " a chain of resumes through an epoch's end). The data, the step seeds, the audit log and the"
                    " next checkpoints count the epoch's batches from the data"
                )
                self.offset = (epoch, expected - batch_idx)
        return self.of(epoch, batch_idx)

    def of(self, epoch: int, batch_idx: int) -> int:
        """Lightning's ``batch_idx`` (or batch count) of ``epoch``, corrected where it disagreed with the data."""
        if self.offset is not None and self.offset[0] == epoch:
            return batch_idx + self.offset[1]
        return batch_idx


def partial_accumulation(trainer: pl.Trainer, batches: int, complete: bool) -> PartialAccumulation | None:
    """The mark of a save inside a gradient accumulation window, or ``None``.

    Lightning steps the optimizer after every ``accumulate_grad_batches``-th batch of an epoch and
    after its last one; batches since the last step live only in the gradients, which no checkpoint
    holds, so a resume from here cannot be exact.
    """
    window = int(trainer.accumulate_grad_batches)
    accumulated = 0 if complete else batches % window
    return PartialAccumulation(accumulated, window, batches) if accumulated else None


def refuse_partial_accumulation(partial: PartialAccumulation | None) -> None:
    if partial is None:
        return
    raise PartialAccumulationError(
        f"the checkpoint was saved after batch {partial.batches} of its epoch, inside a gradient accumulation"
        f" window: {partial.accumulated} of accumulate_grad_batches={partial.window} batches had been"
        " accumulated without an optimizer step. Lightning does not save accumulated gradients, so the resumed"
        " run would step without them and its losses would differ from an uninterrupted run's. Resume from a"
        " checkpoint saved at an accumulation boundary (ModelCheckpoint(every_n_train_steps=...) saves there)"
    )


def refuse_missing_state(checkpoint: dict[str, Any], state_key: str) -> None:
    """Refuse to fit from a checkpoint without the data state, or with one emptied after train batches."""
    callbacks = checkpoint.get("callbacks", {})
    fetched = batches_fetched_before(checkpoint)
    if state_key not in callbacks and fetched == 0:
        return  # written before the first train batch (after validate(), or a fit of no batch): it starts at 0
    if state_key not in callbacks:
        raise MissingStateError(
            "the checkpoint holds no data state: it was written without ResumableDataCallback, so the"
            " position of the train stream is unknown. Resume from a checkpoint written with the callback"
        )
    slot = callbacks[state_key]
    if fetched and holds_no_state(slot):
        # Lightning hands no falsy state to load_state_dict: the data would restart at batch 0.
        raise MissingStateError(
            f"the checkpoint's data state is {'partial' if isinstance(slot, Mapping) and slot else 'empty'}"
            f" ({slot!r:.80}), but it was written after {fetched} train batches: the position of the"
            " train stream is unknown. The checkpoint was altered, or written by other code; resume from"
            " one the callback wrote"
        )


def ends_its_epoch_by_count(checkpoint: Mapping[str, Any], state_key: str, world_size: int) -> bool:
    """Whether Lightning's restart cannot end a checkpoint's epoch at its last batch by counting it against the
    loader's length: another world size counts other batches, a stream's loader may have none (its epoch ends
    where it runs out), and one map-style loader or a mixture may resume with another batch size, which counts
    other batches too (not known here: the loader is built after the restore; 4 -> 2 on 2 processes numbered
    the next epoch's batches from 5 and ended it 5 batches early): such a checkpoint is written as the next
    epoch's start (`lightning_resumable.internals._loop_progress.ended_epoch_resumes_at_the_next`)."""
    slot = checkpoint.get("callbacks", {}).get(state_key)
    if holds_no_state(slot):
        return False
    envelope = parse(slot)
    return envelope.world_size not in (None, world_size) or envelope.kind in ("stream", "loader", "mixture")


def runs_before_next_step(trainer: pl.Trainer) -> bool:
    """Whether what a resume after the batch now ending runs again may follow it: a validation, or the epoch's end
    (``on_train_epoch_end``). Only then are the generators seeded at a step's end, as a resume seeds them there;
    elsewhere nothing a resume repeats draws from them before the next step's seeding (about 30 µs a step). Where
    the clock decides validations (a time-based ``val_check_interval``), at every step's end: asking Lightning
    would read the clock, which Lightning's next read would then find later."""
    if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch or validates_by_time(trainer):
        return True
    return validation_follows(trainer)
