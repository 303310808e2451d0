"""Skipped steps in a fit (``ResumableDataCallback(skip_steps=...)``): checked, planned, applied, recorded.

Promise: the ranges a user gives are checked before any step trains, on every rank alike (malformed,
empty or overlapping ranges, a range before the step the run resumes at, ranks given different ranges: a
`SkipError`, the checkpoint untouched), planned into holes (`lightning_resumable.core.skips`) from where the
run stands, handed to the train input's sampler before its iterator exists, and recorded with the data
state: a later resume keeps them without their being given again, and a range given again as recorded is
the checkpoint's, not a new one (a LightningCLI config keeps its ``skip_steps``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info

from lightning_resumable.core.verification import all_gather_objects
from lightning_resumable.errors import SkipError
from lightning_resumable.format.envelope import Envelope
from lightning_resumable.format.skips import Skip, StepRanges, holes_of, step_ranges
from lightning_resumable.lightning.data_log import DataLog

__all__ = ["SkippedSteps"]


class SkippedSteps:
    """The callback's skips: the ranges given, the skips in force in this fit, and a checkpoint's not applied yet.

    Raises:
        SkipError: ``given`` is malformed, holds an empty range or overlapping ones.
    """

    def __init__(self, given: StepRanges) -> None:
        self.ranges = step_ranges(given)
        self.recorded: tuple[Skip, ...] = ()  # in force in this fit, in the order they were made
        self.checkpoint: tuple[Skip, ...] | None = None  # restored, not yet applied
        self._planned = False  # the given ranges were planned in this fit
        self.checkpoint_step: int | None = None  # the restored checkpoint's global_step (its loops may not be yet)
        self._mark: dict[str, Any] | None = None  # the skip whose first step trains now, for the audit log
        self._owner: Any = None  # the train input's owner these skips were last given to

    def __getstate__(self) -> dict[str, Any]:
        """Pickled with its callback (``torch.save(trainer)``): the owner it holds for the fit is left behind."""
        return {**self.__dict__, "_owner": None}

    def new_fit(self) -> None:
        self.recorded, self.checkpoint, self._planned, self._mark = (), None, False, None
        self.checkpoint_step, self._owner = None, None

    def restored(self, skips: tuple[Skip, ...]) -> None:
        """A checkpoint's skips, for the loader taken next; what was planned before (a loader built before the
        restore, as ``estimated_stepping_batches`` builds it) is planned again from the checkpoint's step."""
        self.recorded, self.checkpoint, self._planned = (), skips, False

    def take(self, owner: Any, trainer: pl.Trainer | None, position: Callable[[], None]) -> None:
        """Give ``owner`` the holes in force, run ``position`` (its restore or fresh start), then plan the given
        ranges from there (once per fit) and give it their holes too."""
        if self.checkpoint is not None:
            self.recorded, self.checkpoint = self.checkpoint, None
        elif self._owner is not None:  # a loader built again in the fit: what the last one did of the skips goes on
            self.recorded = self._owner.recorded_skips(self.recorded)
        self._owner = owner
        if self.recorded or self.ranges:
            owner.set_holes(holes_of(self.recorded))
            if trainer is not None:
                owner.watch_steps(trainer)
        position()
        if self._planned or trainer is None:  # None: a loader taken outside a fit, as tests do
            return
        self._planned = True
        # A loader rebuilt in the restore (built before it, by estimated_stepping_batches) is taken before Lightning
        # restores its loops: the step the run resumes at is the checkpoint's.
        step = trainer.global_step if self.checkpoint_step is None else self.checkpoint_step
        accumulate, limit = trainer.accumulate_grad_batches, trainer.limit_train_batches
        self.recorded = owner.reached_at(self.recorded, step, accumulate, limit)  # on another world size: its steps
        self._agree()
        known = {skip.steps for skip in self.recorded}
        new = [each for each in self.ranges if each not in known]
        if not new:
            return
        for each in new:
            if each.first < step:
                raise SkipError(
                    f"the skipped steps {each} start before step {step}, where the run resumes: resume from a"
                    f" checkpoint saved at or before step {each.first} (the checkpoint was left as it was)"
                )
            clash = [s.steps for s in self.recorded if not (each.last < s.steps.first or s.steps.last < each.first)]
            if clash:
                raise SkipError(f"the skipped steps {each} overlap the checkpoint's skipped steps {clash[0]}")
        made = owner.plan_skips(new, step, accumulate, limit)
        self.recorded = (*self.recorded, *made)
        owner.set_holes(holes_of(self.recorded))
        if any(skip.at == step for skip in made):
            owner.skip_verification()  # the next batch is the one after the skip, not the checkpoint's
        for skip in made:
            rank_zero_info(
                f"lightning_resumable: steps {skip.steps} ({skip.steps.steps} steps) will be skipped: their data"
                f" ({sum(hole.length for hole in skip.holes):,} positions) is passed over at step {skip.at}"
            )

    def _agree(self) -> None:
        given = [str(each) for each in self.ranges]
        every = all_gather_objects(given)
        if any(each != given for each in every):
            shown = "; ".join(f"rank {rank}: {','.join(each) or 'none'}" for rank, each in enumerate(every))
            raise SkipError(f"the ranks were given different skipped steps ({shown}): give every rank the same")

    def step_started(self, trainer: pl.Trainer, first_of_step: bool) -> None:
        """A batch begins: if it is the first of the first step after a skip, the audit log marks it and the
        trainer's logger logs it."""
        step = trainer.global_step
        found = [skip for skip in self.recorded if skip.at == step] if first_of_step else []
        self._mark = {"steps": str(found[0].steps), "holes": [h.to_list() for h in found[0].holes]} if found else None
        if found:
            DataLog.skipped(trainer, step, found[0].steps.steps)

    def audit_mark(self) -> dict[str, Any] | None:
        """What the audit log records of the skip the step in training follows (once)."""
        mark, self._mark = self._mark, None
        return mark

    def enveloped(self, envelope: Envelope) -> Envelope:
        """``envelope`` with the skips in force recorded (a state that holds none keeps none)."""
        if envelope.state is None or not self.recorded or self._owner is None:
            return envelope
        return replace(envelope, skips=self._owner.recorded_skips(self.recorded))
