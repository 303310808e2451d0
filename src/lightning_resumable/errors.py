"""Every exception the library raises derives from `ResumeError`.

A user catches ``ResumeError`` to handle all of them; each subclass names one way a resume can go
wrong, and its message says which values differ.
"""

from __future__ import annotations

__all__ = [
    "ContractViolationError",
    "DuplicateCallbackError",
    "IncompatibleStateError",
    "InconsistentRankStateError",
    "LateRestoreError",
    "MissingCallbackError",
    "MissingStateError",
    "MixtureError",
    "NoTrainerError",
    "NotInSampleFetchError",
    "OrderUnknownError",
    "PartialAccumulationError",
    "PendingRestoreError",
    "ResumeError",
    "ResumeVerificationError",
    "SkipError",
    "StateFormatError",
    "StreamPositionError",
    "UnfingerprintableBatchError",
    "UnsupportedLoaderError",
    "WeightsDisagreementError",
    "WorkerCountChangedError",
    "WorldSizeChangedError",
]


MESSAGE_LIMIT = 2000
"""Characters of a message kept: a value quoted from a damaged checkpoint (a list of a million
fingerprints, say) must not become a message of megabytes."""


class ResumeError(RuntimeError):
    """Base class: resuming the data stream exactly is impossible as configured."""

    def __init__(self, message: str = "", *args: object) -> None:
        if len(message) > MESSAGE_LIMIT:
            message = f"{message[:MESSAGE_LIMIT]}... ({len(message) - MESSAGE_LIMIT:,} characters more)"
        super().__init__(message, *args)


class IncompatibleStateError(ResumeError):
    """The checkpoint's data state was written by a setup that differs from the current one."""


class WorldSizeChangedError(IncompatibleStateError):
    """The number of processes changed where the saved position cannot be split anew.

    Raised for a map-style loader with ``ResumableDataCallback(allow_world_size_change=False)``, for
    several train loaders, and for a stream whose position is per rank.
    """


class WorkerCountChangedError(IncompatibleStateError):
    """A stream resumes with another number of loader workers, whose saved states mean other slices of it."""


class StateFormatError(ResumeError):
    """The persisted data state is malformed or of an unknown version."""


class MissingStateError(ResumeError):
    """A checkpoint is being resumed that holds no data state of this library."""


class MissingCallbackError(ResumeError):
    """A ``ResumableDataModule`` is used without a ``ResumableDataCallback`` on the trainer, or the reverse."""


class DuplicateCallbackError(ResumeError):
    """The trainer has more than one ``ResumableDataCallback``: the train loader's position has one owner."""


class NoTrainerError(ResumeError):
    """``train_dataloader()`` of a ``ResumableDataModule`` was called without a trainer attached."""


class LateRestoreError(ResumeError):
    """The data state was restored after training from the train loader had started.

    A loader built before the restore (a strategy that restores after ``setup``, with
    ``estimated_stepping_batches``) has trained nothing and is built again; one already trained from
    cannot be repositioned.
    """


class UnfingerprintableBatchError(ResumeError):
    """At a save, an element of the next batch cannot be digested (it does not pickle), so the resume
    cannot be verified; ``ResumableDataCallback(verify=False)`` saves without the fingerprint."""


class StreamPositionError(ResumeError):
    """At a save, the trainer's count of completed batches is one the stream loader holds no state for
    (the loader was iterated outside the trainer, or more than one batch ahead)."""


class UnsupportedLoaderError(ResumeError):
    """``train_dataloader()`` returned something that cannot be made resumable exactly."""


class ResumeVerificationError(ResumeError):
    """The batch a resumed rank is about to train differs from the one the checkpoint recorded."""


class NotInSampleFetchError(ResumeError):
    """`sample_rng` was called outside a sample fetch of a resumable loader."""


class ContractViolationError(ResumeError):
    """An object in the train loader persists a derived quantity, or a wrapper other state than its inner object's."""


class InconsistentRankStateError(ResumeError):
    """State that is persisted once for all ranks (a dataset's own state) differs between ranks at a save."""


class PartialAccumulationError(ResumeError):
    """The checkpoint was saved inside a gradient accumulation window.

    Lightning does not save the gradients accumulated so far (nor does this library), so a resume
    would step the optimizer without them: the data would be exact but the losses not.
    """


class PendingRestoreError(ResumeError):
    """``set_epoch`` selected another epoch after a restore and before the restored pass began.

    It would drop the restored position and start that epoch from its beginning. Fabric's
    ``setup_dataloaders`` does this on every pass (``set_epoch`` with its count of passes, 0 in a new
    process): restore a Fabric loader with `lightning_resumable.lightning.fabric.restore_loader`.
    """


class MixtureError(ResumeError):
    """A `Mixture` or its weights are malformed: a weight that is not a finite non-negative number, none
    positive, a weight for a source the mixture does not hold, a schedule that does not start at 0."""


class WeightsDisagreementError(MixtureError):
    """Ranks set a mixture's weights differently at one call (other weights, another step): training on
    them would draw a different mixture on each rank. The message shows each rank's."""


class SkipError(ResumeError):
    """Skipped steps (``ResumableDataCallback(skip_steps=...)``) that cannot be honoured exactly: malformed,
    empty or overlapping ranges, a range before the checkpoint's step, ranks given different ranges, or a
    train input whose skipped data the library cannot pass over; raised before any step trains."""


class OrderUnknownError(ResumeError):
    """``batches`` (`lightning_resumable.tools.step_batches`) cannot tell a step's samples from the checkpoint: its
    state does not determine the order there (a stream, a sampler's own arguments, a mixture's schedule)."""
