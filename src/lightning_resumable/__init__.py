"""Exact mid-epoch resume for PyTorch Lightning under DDP."""

from importlib.metadata import version

from lightning_resumable.batches import ResumableBatchSampler
from lightning_resumable.callback import ResumableDataCallback
from lightning_resumable.contract import PassThroughWrapper
from lightning_resumable.datamodule import ResumableDataModule
from lightning_resumable.errors import (
    ContractViolationError,
    IncompatibleStateError,
    InconsistentRankStateError,
    MissingCallbackError,
    MissingStateError,
    NotInSampleFetchError,
    PartialAccumulationError,
    PendingRestoreError,
    ResumeError,
    ResumeVerificationError,
    StateFormatError,
    UnsupportedLoaderError,
    WorkerCountChangedError,
    WorldSizeChangedError,
)
from lightning_resumable.order import EpochOrder
from lightning_resumable.randomness import SampleRng, SampleSeededDataset, sample_rng
from lightning_resumable.sampler import ResumableSampler
from lightning_resumable.state import DataState

__all__ = [
    "ContractViolationError",
    "DataState",
    "EpochOrder",
    "IncompatibleStateError",
    "InconsistentRankStateError",
    "MissingCallbackError",
    "MissingStateError",
    "NotInSampleFetchError",
    "PartialAccumulationError",
    "PassThroughWrapper",
    "PendingRestoreError",
    "ResumableBatchSampler",
    "ResumableDataCallback",
    "ResumableDataModule",
    "ResumableSampler",
    "ResumeError",
    "ResumeVerificationError",
    "SampleRng",
    "SampleSeededDataset",
    "StateFormatError",
    "UnsupportedLoaderError",
    "WorkerCountChangedError",
    "WorldSizeChangedError",
    "sample_rng",
]

__version__ = version("lightning-resumable")  # one place: pyproject.toml, read from the installed metadata
