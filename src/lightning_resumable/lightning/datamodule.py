"""The mixin that makes a LightningDataModule's train loader resumable."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.core.hooks import DataHooks

from lightning_resumable.errors import DuplicateCallbackError, MissingCallbackError, NoTrainerError
from lightning_resumable.internals._dunder_patches import undo_argument_recording
from lightning_resumable.lightning.callback import ResumableDataCallback
from lightning_resumable.lightning.train_input import build_train_input
from lightning_resumable.lightning.validation import seed_validation_loaders

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
        _wrap(cls, "train_dataloader", _resumable)
        _wrap(cls, "val_dataloader", _seeded_validation)


def _wrap(cls: type, name: str, wrapper: Callable[[Callable[[Any], Any]], Callable[[Any], Any]]) -> None:
    """Wrap the hook ``name`` the class resolves to, wherever the user defined it (this class or a base), once."""
    user_hook = getattr(cls, name, None)
    if user_hook is None or user_hook is getattr(DataHooks, name) or getattr(user_hook, _WRAPPED, False):
        return
    setattr(cls, name, wrapper(user_hook))


def _resumable(user_train_dataloader: Callable[[Any], Any]) -> Callable[[Any], Any]:
    @functools.wraps(user_train_dataloader)
    def train_dataloader(self: ResumableDataModule) -> Any:
        try:
            kept = _kept_train_input(self)
            return kept if kept is not None else _resumable_train_input(self, user_train_dataloader(self))
        except BaseException:
            undo_argument_recording()  # Lightning leaves it in place when the hook raises
            raise

    setattr(train_dataloader, _WRAPPED, True)
    return train_dataloader


_BUILT = "_lightning_resumable_train_input"
"""The datamodule's attribute holding the train input `_resumable_train_input` last built (its owner is the
callback's, which a datamodule does not hold: a trainer pickles with its datamodule)."""


def _kept_train_input(self: ResumableDataModule) -> Any:
    """The train input last built, handed to Lightning again for it to count its batches anew
    (`lightning_resumable.lightning.owners.Owner.recount_at_epoch_end`: a data library's dataset is not built twice
    in one process), or ``None``: build it."""
    trainer = getattr(self, "trainer", None)
    owner = None if trainer is None else _find_callback(trainer).owner
    if owner is None or not owner.recounting:  # a new fit has no owner yet; one retired at a fit's end does not recount
        return None
    owner.recounting = False
    return getattr(self, _BUILT)


def _resumable_train_input(self: ResumableDataModule, loader: Any) -> Any:
    """What ``train_dataloader()`` returns: the user's loaders made resumable, their owner handed to the callback."""
    trainer = getattr(self, "trainer", None)
    if trainer is None:
        raise NoTrainerError(
            "train_dataloader() of a ResumableDataModule runs under a Trainer; attach the datamodule with"
            " trainer.fit(model, datamodule)"
        )
    callback = _find_callback(trainer)
    owner, iterated = build_train_input(
        loader,
        trainer,
        callback.shuffle_seed(trainer),
        seed_samples=callback.seed_samples,
        seed_steps=callback.seed_steps,
    )
    callback.take(owner, trainer.current_epoch)
    setattr(self, _BUILT, iterated)
    return iterated


def _seeded_validation(user_val_dataloader: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``val_dataloader()``, each sample seeded by its index (`lightning_resumable.lightning.validation`) when the
    trainer has the callback and it seeds samples; the loaders are the user's otherwise."""

    @functools.wraps(user_val_dataloader)
    def val_dataloader(self: ResumableDataModule) -> Any:
        loaders = user_val_dataloader(self)
        trainer = getattr(self, "trainer", None)
        found = [] if trainer is None else trainer.callbacks
        callbacks = [callback for callback in found if isinstance(callback, ResumableDataCallback)]
        if len(callbacks) != 1 or not callbacks[0].seed_samples:
            return loaders
        return seed_validation_loaders(loaders, callbacks[0].shuffle_seed(trainer))  # type: ignore[arg-type]

    setattr(val_dataloader, _WRAPPED, True)
    return val_dataloader
