"""Lightning's loop progress as a checkpoint writes it, made to resume where the data does: the one place
that edits the dumped ``loops`` (``on_save_checkpoint``). Lightning-private, as the rest of `internals`.

Checked against lightning 2.6.6; ``tests/test_lightning_internals.py`` reads the keys and restart stages.
"""

from __future__ import annotations

import copy
from typing import Any

import lightning.pytorch as pl

from lightning_resumable.internals._lightning import _processed, validation_follows

__all__ = ["RestoredLoops", "ended_epoch_resumes_at_the_next", "loops_resume_where_the_data_does"]


class RestoredLoops:
    """A save between a fit's restore and its first training batch writes the loops it was restored from.

    Nothing has run since the restore, so they are where a resume must start; the live loops are not:
    Lightning's restart resets their progress first (``reset_on_restart``), and a validation the restore
    left due before the next batch (a checkpoint at a batch's end) would be skipped by a resume from them
    (a preemption signal received before the train loop ends the fit at the train start and saves there).
    """

    def __init__(self) -> None:
        self._loops: Any = None

    def restored(self, checkpoint: dict[str, Any]) -> None:
        self._loops = copy.deepcopy(checkpoint.get("loops"))

    def batch_started(self) -> None:
        self._loops = None

    def write(self, trainer: pl.Trainer, checkpoint: dict[str, Any]) -> None:
        """``on_save_checkpoint``: the restored loops before the first batch, else the live ones made to resume
        where the data does."""
        if self._loops is not None:
            checkpoint["loops"] = copy.deepcopy(self._loops)
        else:
            loops_resume_where_the_data_does(trainer, checkpoint)


def loops_resume_where_the_data_does(trainer: pl.Trainer, checkpoint: dict[str, Any]) -> None:
    """Every edit of the dumped loops, in order (``on_save_checkpoint``): the batch totals first, as the
    others read them."""
    batch_totals_count_what_was_trained(checkpoint)
    validation_resumes_from_its_start(trainer, checkpoint)
    epoch_resumes_where_its_batches_stopped(trainer, checkpoint)


def batch_totals_count_what_was_trained(checkpoint: dict[str, Any]) -> None:
    """Write the train batches' ``total`` progress as the batches of earlier epochs plus ``current``.

    A restart resets only ``current`` (``_Progress.reset_on_restart``): after a resume from a save inside a
    step, ``total`` stays one batch ready and started ahead of processed for the rest of the run, and the
    next resume, from an epoch's last batch say, is not recognised as one (``_TrainingEpochLoop``'s restart
    stage reads ``total``): Lightning resumed the ended epoch while the data began the next. ``completed``
    is never ahead, so ``total.completed - current.completed`` counts the earlier epochs' batches.
    """
    loops = checkpoint.get("loops", {}).get("fit_loop")
    progress = loops.get("epoch_loop.batch_progress") if isinstance(loops, dict) else None
    if not isinstance(progress, dict) or not isinstance(progress.get("total"), dict):
        return
    total, current = progress["total"], progress["current"]
    earlier = total["completed"] - current["completed"]
    fixed = {key: current[key] + earlier for key in ("ready", "started", "processed")}
    loops["epoch_loop.batch_progress"] = {**progress, "total": {**total, **fixed}}


def validation_resumes_from_its_start(trainer: pl.Trainer, checkpoint: dict[str, Any]) -> None:
    """Make a checkpoint written before or inside a validation that the run would complete resume with
    that whole validation, as the uninterrupted run had it (``on_save_checkpoint``, on the dumped loops).

    Lightning 2.6 resumes a validation only when the save came inside a ``validation_step``, and then from
    the batch it was in, its earlier batches' metrics lost; a save in ``on_validation_batch_end``, or in
    ``on_train_batch_end`` before a due validation (``ModelCheckpoint(every_n_train_steps=...)``), skips it
    (``_TrainingEpochLoop.advance``: ``increment_progress_to_evaluation_end``, ``_skip_next_val``). Here
    the validation loop's progress is written as ``RESTARTED_MID_EVALUATION`` before its first batch, and,
    for a save before it, the training batch as completed (the validation ran after its completion):
    Lightning's own restart then runs the validation from its first batch before the next training batch.
    A checkpoint written at ``on_validation_end`` (the validation complete), or with no validation due,
    says no validation is in progress: its progress counts as many batches ready as completed. (A run
    restarted mid-evaluation counts one more ready than completed from then on, which would make the
    next resume run a validation again.)
    """
    from lightning.pytorch.trainer.states import TrainerFn

    loops = checkpoint.get("loops", {}).get("fit_loop")
    if trainer.state.fn != TrainerFn.FITTING or trainer.sanity_checking or not isinstance(loops, dict):
        return
    epoch_loop = trainer.fit_loop.epoch_loop
    val, batch = epoch_loop.val_loop.batch_progress, epoch_loop.batch_progress
    if trainer.validating:
        if val.current.ready and val.current.completed == val.current.ready and val.is_last_batch:
            _no_validation_in_progress(loops)  # complete: its on_validation_end (ModelCheckpoint(monitor=...))
            return
        earlier = val.total.ready - val.current.ready  # batches of this epoch's earlier validations
    elif batch.current.completed == _processed(batch.current) - 1 and validation_follows(trainer):
        earlier = val.total.completed
        train = {key: value for key, value in loops["epoch_loop.batch_progress"].items()}
        for part in ("total", "current"):
            train[part] = {**train[part], "completed": train[part]["processed"]}
        loops["epoch_loop.batch_progress"] = train
    else:
        _no_validation_in_progress(loops)
        return
    loops["epoch_loop.val_loop.batch_progress"] = {
        "total": {"ready": earlier + 1, "started": earlier + 1, "processed": earlier, "completed": earlier},
        "current": {"ready": 1, "started": 1, "processed": 0, "completed": 0},
        "is_last_batch": False,
    }


def _no_validation_in_progress(loops: dict[str, Any]) -> None:
    progress = loops.get("epoch_loop.val_loop.batch_progress")
    if isinstance(progress, dict) and isinstance(progress.get("total"), dict):
        done = progress["total"].get("completed", 0)
        total = {**progress["total"], "ready": done, "started": done, "processed": done}
        loops["epoch_loop.val_loop.batch_progress"] = {**progress, "total": total}


def epoch_resumes_where_its_batches_stopped(trainer: pl.Trainer, checkpoint: dict[str, Any]) -> None:
    """Make a checkpoint of an epoch that a fit ended before its last batch (``max_steps``, ``max_time``,
    ``should_stop``) resume inside that epoch (``on_save_checkpoint``, on the dumped loops).

    Lightning ends such an epoch (its ``epoch_progress`` is processed before ``on_train_epoch_end``, where
    ``ModelCheckpoint(save_last=True)`` saves, and ``trainer.save_checkpoint`` after ``fit()`` returned sees it
    completed): a fit extended from it would start the next epoch, the rest of this one never trained, where
    a longer uninterrupted run trains it. The epoch's progress is written as restarted mid-epoch (``FitLoop``'s
    ``RESTARTED_MID_EPOCH``: processed and completed one short of started), so the extended fit trains the
    rest first, as the data state (the epoch's position) says. An iteration-based fit (``max_steps``) that
    ended with its epoch's last batch is written as that epoch completed and the next one not begun:
    Lightning's restart on an epoch's end would otherwise train one more batch in the ended epoch. And a
    save inside an epoch that a restart from the last batch before it began, which Lightning's progress
    does not mark started, is written as that epoch started (else a second resume resumed the epoch before).
    """
    from lightning.pytorch.trainer.states import TrainerFn, TrainerStatus

    loops = checkpoint.get("loops", {}).get("fit_loop")
    if trainer.state.fn != TrainerFn.FITTING or trainer.sanity_checking or not isinstance(loops, dict):
        return
    epoch = trainer.fit_loop.epoch_progress.current
    trained = trainer.fit_loop.epoch_loop.batch_progress.current.completed
    done = _processed(trainer.fit_loop.epoch_loop.batch_progress.current)  # one ahead of trained in its batch's end
    progress = {
        part: dict(values) if isinstance(values, dict) else values for part, values in loops["epoch_progress"].items()
    }
    for values in (progress["total"], progress["current"]):  # an epoch restarted from the last batch before it is
        if values["started"] < values["processed"]:  # never marked started, not even once it ends: every one was
            values["ready"] = values["started"] = values["processed"]
    loops["epoch_progress"] = progress
    started = progress["current"]["started"]
    running = trainer.state.status != TrainerStatus.FINISHED  # not a save after fit() returned
    # After an epoch's end (its last batch completed: a save where the fit loop raises Lightning's SIGTERMException)
    # no next epoch is in progress; an unsized loader's count of batches is below its infinite length there too.
    ended = trainer.fit_loop.epoch_loop.batch_progress.is_last_batch and trained == done
    in_next = started == _processed(epoch) == trainer.current_epoch and 0 < done <= trainer.num_training_batches
    if running and in_next and not ended:
        # Lightning's restart from an epoch's last batch ends that epoch without marking the next one started
        # (its progress stays ready = started = processed): a save inside the next one, or in its last batch's end
        # (before Lightning ends it), would resume the epoch before it. The epoch in progress is written as started.
        for part in ("total", "current"):
            progress[part]["ready"] = progress[part]["started"] = progress[part]["processed"] + 1
        loops["epoch_progress"] = progress
        return
    if started == 0 or _processed(epoch) < started or trained == 0:
        return
    if trained < trainer.num_training_batches and not trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
        for part in ("total", "current"):
            progress[part]["processed"] = progress[part]["completed"] = progress[part]["started"] - 1
    elif trainer.max_steps != -1:  # iteration-based: Lightning's restart on an epoch's end trains a batch too many
        for part in ("total", "current"):
            progress[part]["completed"] = progress[part]["processed"]
        batch_progress = loops["epoch_loop.batch_progress"]
        current = dict.fromkeys(batch_progress["current"], 0)
        loops["epoch_loop.batch_progress"] = {**batch_progress, "current": current, "is_last_batch": False}
    loops["epoch_progress"] = progress


def ended_epoch_resumes_at_the_next(checkpoint: dict[str, Any]) -> None:
    """Make a checkpoint written at an epoch's last batch (``on_train_batch_end``, no validation due) resume at the
    next epoch's first batch (``on_load_checkpoint``, before Lightning restores its loops), where Lightning cannot
    tell that epoch ended by its count: on another world size, or a stream's.

    Lightning's restart there ends the epoch only if its count of the epoch's batches reaches the new loader's
    length, which counts another world size's batches: on fewer processes it went on in the next epoch from the
    old count (2 -> 1: epoch 1's batches numbered from 5, and that epoch ended 5 batches early). A stream without
    a length likewise went on numbering the next epoch's batches from the last one's count (3 batches an epoch:
    epoch 1's numbered from 3: the ``batch_idx`` a training step, its logs and a ``val_check_interval`` read).
    Written as that epoch completed and the next not begun (Lightning's ``RESTARTED_ON_LAST``), which needs no
    length.
    """
    loops = checkpoint.get("loops", {}).get("fit_loop")
    if not isinstance(loops, dict):
        return
    batch, epoch = loops.get("epoch_loop.batch_progress"), loops.get("epoch_progress")
    if not isinstance(batch, dict) or not isinstance(epoch, dict) or not batch.get("is_last_batch"):
        return
    current = batch["current"]
    if current["processed"] != current["completed"] + 1:  # not saved in the last batch's end, or a validation due
        return
    batch = {part: dict(values) if isinstance(values, dict) else values for part, values in batch.items()}
    batch["total"]["completed"] = batch["total"]["processed"]
    batch["current"], batch["is_last_batch"] = dict.fromkeys(current, 0), False
    loops["epoch_loop.batch_progress"] = batch
    epochs = {part: dict(values) for part, values in epoch.items()}
    for values in (epochs["total"], epochs["current"]):
        values["processed"] = values["completed"] = values["started"]
    loops["epoch_progress"] = epochs
    state = loops.get("epoch_loop.state_dict")
    if isinstance(state, dict) and "_batches_that_stepped" in state:  # Lightning's restart counts the last step
        loops["epoch_loop.state_dict"] = {**state, "_batches_that_stepped": state["_batches_that_stepped"] + 1}
