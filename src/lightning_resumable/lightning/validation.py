"""Validation samples drawn under seeds of their own, so that a validation's metric resumes exactly.

Promise: with `seed_validation_loaders`, sample ``i`` of validation loader ``k`` is fetched under a seed
derived from ``(seed, k, i)`` (`lightning_resumable.format._keys.validation_sample_seed`, a domain apart from
the training samples'), in a worker or in the main process alike. A validation dataset that draws
random values (an augmentation, a random crop) then returns the same sample at every validation and
after any resume, where it otherwise draws from whatever state the global generators were left in by
the training steps before it, which a resumed run does not share. The loaders stay the user's: the
same class, sampler, order and settings; only the dataset is wrapped. Nothing is persisted.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader, Dataset, IterableDataset

from lightning_resumable.core.randomness import SampleSeededDataset
from lightning_resumable.format._keys import validation_sample_seed
from lightning_resumable.internals._lightning import rebuild_with_dataset

__all__ = ["UnseededValidationWarning", "ValidationSeededDataset", "seed_validation_loaders"]


class UnseededValidationWarning(UserWarning):
    """A validation loader validates as the user gave it, without per-sample seeds (it cannot be rebuilt)."""


class ValidationSeededDataset(SampleSeededDataset[Any]):
    """The user's validation dataset, each sample fetched under the seed of ``(seed, loader, index)``:
    a `SampleSeededDataset` keyed by the index itself, not by a sampler's keys.

    In the main process the global generators are put back after each fetch, so validating does not
    disturb the training's stream. Attributes it does not have are read from ``.dataset``.
    """

    def __init__(self, dataset: Dataset[Any], seed: int, loader: int) -> None:
        super().__init__(dataset)
        self.seed, self.loader = seed, loader

    def __getitem__(self, index: Any) -> Any:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[Any]) -> list[Any]:
        keys = [(index, validation_sample_seed(self.seed, self.loader, operator.index(index))) for index in indices]
        return self.fetch(keys, seed_globals=True, restore_globals=True)


def seed_validation_loaders(loaders: Any, seed: int) -> Any:
    """``val_dataloader()``'s return value with each map-style loader's dataset seeded per sample; a
    stream, or anything but a loader (or a list, tuple or dict of them), is returned as it is.

    A loader that cannot be rebuilt (a ``batch_sampler`` built outside a Lightning hook, a constructor that
    cannot be replayed) is returned as it is, unseeded, with an `UnseededValidationWarning`.
    """
    if isinstance(loaders, Mapping):
        return {key: _seeded(each, seed, index) for index, (key, each) in enumerate(loaders.items())}
    if isinstance(loaders, (list, tuple)):
        return type(loaders)(_seeded(each, seed, index) for index, each in enumerate(loaders))
    return _seeded(loaders, seed, 0)


def _seeded(loader: Any, seed: int, index: int) -> Any:
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, (IterableDataset, ValidationSeededDataset)):
        return loader
    dataset = ValidationSeededDataset(loader.dataset, seed, index)
    try:
        return rebuild_with_dataset(loader, dataset)
    except ValueError as error:
        # Validation is never refused: plain Lightning validates on this loader, and so does the fit, unseeded.
        rank_zero_warn(
            f"lightning_resumable: validation loader {index} ({type(loader).__name__}) cannot be rebuilt around a"
            f" per-sample seeded dataset ({error}); it validates as given, unseeded, so random draws in its"
            " samples are not the same at every validation nor after a resume",
            category=UnseededValidationWarning,
        )
        return loader
