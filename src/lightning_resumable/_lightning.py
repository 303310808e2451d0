"""Every piece of Lightning internals this library reads, in one place.

Checked against lightning 2.6.6 (the version CI installs); ``tests/test_lightning_internals.py``
fails if these attributes move. Everything else in the library uses public API only.
"""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
from lightning.fabric.utilities.warnings import PossibleUserWarning

__all__ = ["batches_processed", "rebuild_train_loader_at_next_epoch", "silence_not_resumable_warning"]

_NOT_RESUMABLE_WARNING = "You're resuming from a checkpoint that ended before the epoch ended"


def batches_processed(trainer: pl.Trainer) -> int:
    """Batches of the current epoch that the trainer counts as done if a checkpoint is written now.

    ``processed`` is right at every save point: in ``on_train_batch_end`` (the batch is done and the
    resume starts after it), inside ``training_step`` (not yet counted; the resume re-runs it) and
    during mid-epoch validation (counted; the resume starts after it). After a restore, before the
    first batch, it is the count the resumed epoch continues from.
    """
    progress = trainer.fit_loop.epoch_loop.batch_progress.current
    return int(progress.processed)  # type: ignore[attr-defined]  # a _ProcessedTracker at runtime


def silence_not_resumable_warning() -> None:
    """Hide Lightning's warning that a mid-epoch resume is unreliable for a loader without ``state_dict``.

    Our loader deliberately has no ``state_dict`` (the callback is the one owner of its position), so
    Lightning's check (``training_epoch_loop.py``, ``is_resumable_loader``) would warn on every resume.
    """
    warnings.filterwarnings("ignore", message=_NOT_RESUMABLE_WARNING, category=PossibleUserWarning)


def rebuild_train_loader_at_next_epoch(trainer: pl.Trainer) -> None:
    """Make the next epoch call ``train_dataloader()`` again, as ``reload_dataloaders_every_n_epochs`` does.

    Lightning counts an epoch's batches once per loader build (``FitLoop.setup_data`` sets
    ``max_batches``). After a resume on another world size that count is the resumed epoch's (in the
    old world size's units), so the following epochs need a fresh build to be counted right.
    ``setup_data`` rebuilds when ``_combined_loader`` is ``None``; it runs at every epoch start.
    """
    trainer.fit_loop._combined_loader = None
