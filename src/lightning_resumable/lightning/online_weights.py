"""Weights set by the training, agreed across ranks: the loader's read-ahead, and the collective check.

Promise: a change takes effect where no rank's loader has read yet, the same on every rank, or is
refused on every rank (never trained on some ranks and not others).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch

from lightning_resumable.errors import MixtureError, WeightsDisagreementError
from lightning_resumable.format.mixture_state import WeightChange

__all__ = ["agree_on", "read_ahead"]

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
