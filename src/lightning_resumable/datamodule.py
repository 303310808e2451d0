"""The mixin that makes a LightningDataModule's train loader resumable."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.core.hooks import DataHooks
from torch.utils.data import DataLoader, IterableDataset

from lightning_resumable.batches import ResumableBatchSampler
from lightning_resumable.callback import ResumableDataCallback
from lightning_resumable.combined import key_seed, split_train_loaders
from lightning_resumable.errors import (
    DuplicateCallbackError,
    MissingCallbackError,
    NoTrainerError,
    UnsupportedLoaderError,
)
from lightning_resumable.loader import make_resumable

__all__ = ["ResumableDataModule"]

_WRAPPED = "__lightning_resumable_wrapped__"


def _find_callback(trainer: pl.Trainer) -> ResumableDataCallback:
    found = [
        callback
        for callback in trainer.callbacks  # type: ignore[attr-defined]
        if isinstance(callback, ResumableDataCallback)
    ]
    if not found:
        raise MissingCallbackError(
            "a ResumableDataModule needs a ResumableDataCallback in Trainer(callbacks=...), found none"
        )
    if len(found) > 1:
        raise DuplicateCallbackError(
            f"a ResumableDataModule needs exactly one ResumableDataCallback in Trainer(callbacks=...), found"
            f" {len(found)}: the train loader's position has one owner"
        )
    return found[0]


class ResumableDataModule:
    """Mixin: the loader that ``train_dataloader()`` returns comes back exactly resumable.

    Put it before ``LightningDataModule``; keep ``train_dataloader()`` returning an ordinary
    ``DataLoader`` or ``StatefulDataLoader`` (any ``shuffle``, ``num_workers``,
    ``persistent_workers``, ``drop_last``, ``batch_size``), a loader over an ``IterableDataset``
    with ``state_dict``/``load_state_dict``, or a list, dict or ``CombinedLoader`` of map-style
    loaders (each gets a seed of its own, from the run's seed and its key). The mixin rebuilds it around a
    `ResumableSampler` for this process's rank and world size, seeded
    with the run's shuffle seed, wraps the dataset in a
    `SampleSeededDataset` (each sample is fetched under the seed of its
    global position; attributes are read through to your dataset, which is ``.dataset``), and hands
    the loader to `ResumableDataCallback`, which positions it before the first batch is drawn.

    Pass-through contract: the persisted state is the sampler's global state only; rank, world size
    and shard offsets are derived again from the current trainer on every restore.

    Raises:
        MissingCallbackError: no ``ResumableDataCallback`` on the trainer, or no trainer attached.
        UnsupportedLoaderError: the returned loader cannot be resumed exactly (message says why).

    Example:
        ```python
        class MyData(ResumableDataModule, L.LightningDataModule):
            def train_dataloader(self):
                return DataLoader(self.dataset, batch_size=32, shuffle=True)
        ```
    """

    trainer: pl.Trainer | None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The method the class resolves to, wherever the user defined it (this class or a base).
        user_train_dataloader = getattr(cls, "train_dataloader", None)
        if user_train_dataloader is None or user_train_dataloader is DataHooks.train_dataloader:
            return
        if not getattr(user_train_dataloader, _WRAPPED, False):
            cls.train_dataloader = _resumable(user_train_dataloader)  # type: ignore[attr-defined]


def _resumable(user_train_dataloader: Callable[[Any], Any]) -> Callable[[Any], Any]:
    @functools.wraps(user_train_dataloader)
    def train_dataloader(self: ResumableDataModule) -> Any:
        loader = user_train_dataloader(self)
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            raise NoTrainerError(
                "train_dataloader() of a ResumableDataModule runs under a Trainer; attach the datamodule with"
                " trainer.fit(model, datamodule)"
            )
        callback = _find_callback(trainer)
        seed = callback.shuffle_seed(trainer)

        def resumable(each: object, each_seed: int) -> DataLoader[Any]:
            return make_resumable(
                each,
                seed=each_seed,
                num_replicas=trainer.world_size,
                rank=trainer.global_rank,
                seed_samples=callback.seed_samples,
                # Lightning fetches each batch before on_train_batch_start, where a reseeding callback
                # sets the step's stream anyway: putting the generators back would be wasted work.
                restore_globals=not callback.seed_steps,
                epoch_source=lambda: trainer.current_epoch,
                allow_inexact_streams=callback.allow_inexact_streams,
            )

        several = split_train_loaders(loader)
        if several is None:
            single = resumable(loader, seed)
            callback.attach(single, trainer.current_epoch)
            return single
        loaders, mode, rebuild = several
        for key, each in loaders.items():
            _refuse_among_several(key, each)
        rebuilt = {key: resumable(each, key_seed(seed, key)) for key, each in loaders.items()}
        callback.attach_several(rebuilt, mode, trainer.current_epoch)
        return rebuild(rebuilt)

    setattr(train_dataloader, _WRAPPED, True)
    return train_dataloader


def _refuse_among_several(key: str, loader: object) -> None:
    """What several train loaders cannot hold yet: a stream, or a batch sampler (whose epochs may differ in length)."""
    if isinstance(loader, DataLoader) and isinstance(loader.dataset, IterableDataset):
        raise UnsupportedLoaderError(
            f"the train loader {key!r} reads a stream (an IterableDataset); a stream is supported as the only train"
            " loader, not among several"
        )
    if isinstance(loader, DataLoader) and isinstance(loader.batch_sampler, ResumableBatchSampler):
        raise UnsupportedLoaderError(
            f"the train loader {key!r} has a ResumableBatchSampler; it is supported as the only train loader, not"
            " among several"
        )
