"""The mixture in the trainer's logger: the weights in force, each source's realised share, the skipped steps.

Promise: with a `Mixture` train loader, at Lightning's logging interval (``Trainer(log_every_n_steps=...)``),
rank 0 hands ``trainer.logger`` (CSV, TensorBoard, Weights & Biases: whichever it is) the weights the last step
was drawn under (``mixture/weight/<source>``) and each source's share of the samples every rank trained since
the last log (``mixture/share/<source>``; counted per rank, summed over the ranks in one reduction at the
log's step only). A skip logs ``data/skipped_steps`` (the steps passed over) at the step it applies, whatever
the train input. Nothing is persisted: the interval's share is the same in a resumed run as in an
uninterrupted one. ``ResumableDataCallback(log_mixture=False)`` turns the mixture's metrics off.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import lightning.pytorch as pl
import torch

__all__ = ["DataLog"]


class DataLog:
    """The counts of the current logging interval, and what a log step writes (see the module's promise)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._counts: list[int] = []
        self._logged_step = -1

    def batch_trained(self, trainer: pl.Trainer, owner: Any, batch: int) -> None:
        """After each trained batch, on every rank (the same batch everywhere): count its sources; at a log step,
        reduce the counts over the ranks and log on rank 0. ``batch``: the library's count in the epoch."""
        names = getattr(getattr(owner, "mixture", None), "names", None)
        if not self.enabled or names is None:
            return
        if len(self._counts) != len(names):
            self._counts = [0] * len(names)
        for source in owner.sources_of(batch):
            self._counts[source] += 1
        step = trainer.global_step  # after this batch's optimizer step, if it made one
        every = max(1, getattr(trainer, "log_every_n_steps", 50))  # set on the Trainer by its logger connector
        if step == self._logged_step or step % every != 0 or step == 0:
            return
        self._logged_step = step
        counts = trainer.strategy.reduce(torch.tensor(self._counts, dtype=torch.float64), reduce_op="sum")
        self._counts = [0] * len(names)
        if trainer.is_global_zero and trainer.logger is not None:
            total = float(counts.sum()) or 1.0
            weights = {name: float(Fraction(weight)) for name, weight in owner.weights_of(batch).items()}
            metrics = {f"mixture/weight/{name}": weights.get(name, 0.0) for name in names}
            metrics.update({f"mixture/share/{name}": float(counts[k]) / total for k, name in enumerate(names)})
            trainer.logger.log_metrics(metrics, step=step - 1)  # the step as the training step logged it

    @staticmethod
    def skipped(trainer: pl.Trainer, step: int, steps: int) -> None:
        """A skip of ``steps`` steps applies at ``step`` (rank 0 logs it)."""
        if trainer.is_global_zero and trainer.logger is not None:
            trainer.logger.log_metrics({"data/skipped_steps": float(steps)}, step=step)
