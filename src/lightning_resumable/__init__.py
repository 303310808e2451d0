"""Exact mid-epoch resume for PyTorch Lightning under DDP.

The two Lightning integration classes are imported on first use, so that reading a checkpoint
(``lightning-resumable inspect``, `lightning_resumable.format.envelope`) does not import Lightning.
"""

from importlib import import_module
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

from lightning_resumable import _moved
from lightning_resumable.core.batch_sources import BatchSources
from lightning_resumable.core.batches import ResumableBatchSampler
from lightning_resumable.core.chunks import Chunked
from lightning_resumable.core.mixture import Mixture
from lightning_resumable.core.order import EpochOrder
from lightning_resumable.core.randomness import SampleRng, SampleSeededDataset, sample_rng
from lightning_resumable.core.sampler import ResumableSampler
from lightning_resumable.core.schedule import WeightSchedule
from lightning_resumable.errors import (
    ContractViolationError,
    DuplicateCallbackError,
    IncompatibleStateError,
    InconsistentRankStateError,
    LateRestoreError,
    MissingCallbackError,
    MissingStateError,
    MixtureError,
    NotInSampleFetchError,
    NoTrainerError,
    OrderUnknownError,
    PartialAccumulationError,
    PendingRestoreError,
    ResumeError,
    ResumeVerificationError,
    SkipError,
    StateFormatError,
    StreamPositionError,
    UnfingerprintableBatchError,
    UnsupportedLoaderError,
    WeightsDisagreementError,
    WorkerCountChangedError,
    WorldSizeChangedError,
)
from lightning_resumable.format.mixture_state import WeightChange
from lightning_resumable.format.state import DataState
from lightning_resumable.readers.contract import PassThroughWrapper
from lightning_resumable.readers.mosaic_environment import set_mosaic_environment

if TYPE_CHECKING:
    from lightning_resumable.lightning.callback import ResumableDataCallback
    from lightning_resumable.lightning.datamodule import ResumableDataModule

_LIGHTNING_CLASSES = {
    "ResumableDataCallback": "lightning.callback",
    "ResumableDataModule": "lightning.datamodule",
}


def __getattr__(name: str) -> Any:
    if name in _LIGHTNING_CLASSES:
        value = getattr(import_module(f"lightning_resumable.{_LIGHTNING_CLASSES[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'lightning_resumable' has no attribute {name!r}")


__all__ = [
    "BatchSources",
    "Chunked",
    "ContractViolationError",
    "DataState",
    "DuplicateCallbackError",
    "EpochOrder",
    "IncompatibleStateError",
    "InconsistentRankStateError",
    "LateRestoreError",
    "MissingCallbackError",
    "MissingStateError",
    "Mixture",
    "MixtureError",
    "NoTrainerError",
    "NotInSampleFetchError",
    "OrderUnknownError",
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
    "SkipError",
    "StateFormatError",
    "StreamPositionError",
    "UnfingerprintableBatchError",
    "UnsupportedLoaderError",
    "WeightChange",
    "WeightSchedule",
    "WeightsDisagreementError",
    "WorkerCountChangedError",
    "WorldSizeChangedError",
    "sample_rng",
    "set_mosaic_environment",
]

_moved.install()  # 0.2.0's module paths (lightning_resumable.sampler...), deprecated until 0.4.0

__version__ = version("lightning-resumable")  # one place: pyproject.toml, read from the installed metadata
