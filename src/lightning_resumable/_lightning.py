"""Every piece of Lightning internals this library reads, in one place.

Checked against lightning 2.6.6 (the version CI installs); ``tests/test_lightning_internals.py``
fails if these attributes move. Everything else in the library uses public API only.
"""

from __future__ import annotations

import lightning.pytorch as pl

__all__ = ["batches_processed"]


def batches_processed(trainer: pl.Trainer) -> int:
    """Batches of the current epoch that the trainer counts as done if a checkpoint is written now.

    ``processed`` is right at every save point: in ``on_train_batch_end`` (the batch is done and the
    resume starts after it), inside ``training_step`` (not yet counted; the resume re-runs it) and
    during mid-epoch validation (counted; the resume starts after it). After a restore, before the
    first batch, it is the count the resumed epoch continues from.
    """
    progress = trainer.fit_loop.epoch_loop.batch_progress.current
    return int(progress.processed)  # type: ignore[attr-defined]  # a _ProcessedTracker at runtime
