"""Weights set by the training, agreed across ranks: the loader's read-ahead, and the collective check.

Promise: a change takes effect where no rank's loader has read yet, the same on every rank, or is
refused on every rank (never trained on some ranks and not others).
"""

from __future__ import annotations

from typing import Any, Self

import lightning.pytorch as pl
import torch

from lightning_resumable.core.batch_sources import BatchSources
from lightning_resumable.core.schedule import Weights
from lightning_resumable.errors import MissingCallbackError, MixtureError, WeightsDisagreementError
from lightning_resumable.format.mixture_state import WeightChange
from lightning_resumable.lightning.mixture_owner import MixtureOwner

__all__ = ["MixtureWeights", "agree_on", "read_ahead"]

TRAINER_PREFETCH = 1
"""Batches the trainer may hold beyond the one in training (Lightning's fetcher prefetches one for a
loader without a length; counted always, so the delay does not depend on which loader it is)."""


def read_ahead(loader: Any) -> int:
    """Batches a loader may have read beyond the one in training: ``num_workers * prefetch_factor`` in its
    workers, and the trainer's one."""
    workers = int(getattr(loader, "num_workers", 0) or 0)
    prefetch = getattr(loader, "prefetch_factor", None) or 2
    return workers * prefetch + TRAINER_PREFETCH if workers else TRAINER_PREFETCH


def agree_on(trainer: pl.Trainer, change: WeightChange, ready: bool, names: tuple[str, ...], ahead: int) -> None:
    """Check, across ranks, that every rank planned ``change`` and has read nothing where it takes effect.

    Raises:
        WeightsDisagreementError: the ranks' changes differ (weights, or the step asked at or given).
        MixtureError: a rank has read where the change would take effect (more than ``ahead`` batches).
    """
    row = [change.asked, change.step, change.position, int(ready), change.period]
    row += [change.parts.get(name, 0) for name in names]
    mine = torch.tensor(row, dtype=torch.int64, device=trainer.strategy.root_device)
    rows = trainer.strategy.all_gather(mine).reshape(-1, len(row)).cpu().tolist()
    if any(other[:3] + other[4:] != row[:3] + row[4:] for other in rows):
        shown = "; ".join(
            f"rank {rank}: asked at step {other[0]}, from step {other[1]}, {_weights(names, other[5:], other[4])}"
            for rank, other in enumerate(rows)
        )
        raise WeightsDisagreementError(
            "the ranks set the mixture's weights differently; each rank would draw another mixture."
            f" Call set_mixture_weights on every rank with the same weights at the same step: {shown}"
        )
    behind = [rank for rank, other in enumerate(rows) if not other[3]]
    if behind:
        raise MixtureError(
            f"rank(s) {behind} read stream position {change.position:,} (step {change.step}) already: the loader"
            f" read more than the {ahead} batches ahead it is counted for; give a later at_step"
        )


def _weights(names: tuple[str, ...], parts: list[int], period: int) -> str:
    return "{" + ", ".join(f"{name}: {part}/{period}" for name, part in zip(names, parts, strict=True) if part) + "}"


class MixtureWeights:
    """`ResumableDataCallback`'s part for a train `Mixture`'s weights set by the training: the call, the history,
    and each sample's source."""

    _trainer: pl.Trainer | None
    _owner: Any
    _captured: Any

    def _capture(self, trainer: pl.Trainer, collective: bool = True) -> None: ...  # the callback's

    @classmethod
    def of(cls, trainer: pl.Trainer) -> Self:
        """The trainer's `ResumableDataCallback`: ``ResumableDataCallback.of(self.trainer)`` in a ``LightningModule``.

        Raises:
            MissingCallbackError: the trainer has none.
        """
        found = [callback for callback in trainer.callbacks if isinstance(callback, cls)]  # type: ignore[attr-defined]
        if not found:
            raise MissingCallbackError("the trainer has no ResumableDataCallback: add it to Trainer(callbacks=[...])")
        return found[0]

    def set_mixture_weights(self, weights: Weights, *, at_step: int | None = None) -> WeightChange:
        """Draw the train `Mixture` with ``weights`` from a later step on, exactly across resumes.

        Call it **on every rank, with the same weights, at the same step** (from ``training_step``,
        ``on_train_batch_end``, a callback, or during validation): it is a collective, as
        ``self.log(..., sync_dist=True)`` is, and ranks that ask for different weights or at different
        steps are refused with `WeightsDisagreementError` rather than train on different mixtures.
        Weights computed from losses all-reduced across ranks agree.

        The loader has read ahead: ``num_workers * prefetch_factor`` batches in its workers and one
        more for the trainer (``read_ahead``). A change asked at step ``s`` (the batch in training, or
        the last trained one, as a schedule by steps counts them) takes effect at step
        ``s + 1 + read_ahead``, at the start of the next ``accumulate_grad_batches`` window from there;
        or at ``at_step``, not earlier. Every change is recorded in the checkpoint: a resume continues
        with the weights in force, and one asked before a save that takes effect after it does so.

        Returns:
            the change, as recorded: the step asked at, the step and stream position it takes effect, the weights.

        Raises:
            MixtureError: the train input is not a `Mixture`, weights malformed as the `Mixture` refuses
                them, or an ``at_step`` within the read-ahead.
            WeightsDisagreementError: the ranks asked for different weights, or at different steps.
        """
        trainer, owner = self._trainer, self._owner
        if trainer is None or not isinstance(owner, MixtureOwner):
            raise MixtureError("set_mixture_weights needs a fit whose train_dataloader() returns a Mixture's loader")
        ahead = read_ahead(owner.one.owned.loader)
        change, ready = owner.plan_change(weights, at_step, ahead, trainer.accumulate_grad_batches)
        agree_on(trainer, change, ready, owner.mixture.names, ahead)
        owner.change(change)
        if self._captured is not None:
            self._captured = None  # a preemption's state, taken at this batch's end: it records the change too
            self._capture(trainer)
        return change

    def weight_changes(self) -> tuple[WeightChange, ...]:
        """Every change of the train `Mixture`'s weights the training set in this run, resumes included, in
        the order they take effect (the last one's weights are the newest asked, in force or pending).

        Raises:
            MixtureError: the train input is not a `Mixture`.
        """
        if not isinstance(self._owner, MixtureOwner):
            raise MixtureError("weight_changes needs a fit whose train_dataloader() returns a Mixture's loader")
        return tuple(self._owner.changes)

    def batch_sources(self) -> BatchSources:
        """The source of each sample of this rank's batch in training (or the last trained), looked up
        from its stream positions: a per-source loss is ``sources.means(per_sample_loss)``.

        Raises:
            MixtureError: the train input is not a `Mixture`, or no batch has been trained yet in this fit.
        """
        owner = self._owner
        if not isinstance(owner, MixtureOwner) or owner.training_batch is None:
            raise MixtureError("batch_sources needs a batch in training from a Mixture's loader")
        return BatchSources(owner.mixture.names, torch.tensor(owner.sources_of(owner.training_batch), dtype=torch.long))
