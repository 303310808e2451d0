"""Exact resume in a Lightning Fabric loop, with a `ResumableSampler` in the loader Fabric sets up.

Fabric's ``setup_dataloaders`` wraps the loader, and on every pass calls ``sampler.set_epoch`` with
its count of passes in this process. After a restart that count begins at 0 again: the restored
epoch would be replaced by epoch 0 (a `PendingRestoreError` says so), and every later epoch would
get another epoch's order. `restore_loader` restores the sampler and sets that count to the
restored epoch, so the resumed passes are the run's epochs again. `loader_state` is what to save.

Example:
    ```python
    sampler = ResumableSampler(dataset, seed=42, batch_size=8)  # rank and world size from Fabric's process group
    loader = fabric.setup_dataloaders(DataLoader(dataset, batch_size=8, sampler=sampler))
    epoch, batches = 0, 0
    if resuming:
        rest = fabric.load(path, {"model": model, "optimizer": optimizer})
        epoch, batches = restore_loader(loader, rest["data"])
    for epoch in range(epoch, epochs):
        for batch_idx, batch in enumerate(loader, start=batches):
            ...  # a training step; to checkpoint after it:
            fabric.save(path, {"model": model, "optimizer": optimizer, "data": loader_state(loader, batch_idx + 1)})
        batches = 0
    ```
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning_resumable.core.mixture_sampler import MixtureSampler
from lightning_resumable.core.sampler import ResumableSampler
from lightning_resumable.errors import UnsupportedLoaderError
from lightning_resumable.internals._lightning import set_fabric_pass_count

__all__ = ["loader_state", "restore_loader"]


def _sampler_of(loader: object) -> ResumableSampler:
    for sampler in (getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
        if isinstance(sampler, MixtureSampler):
            raise UnsupportedLoaderError(
                "a Mixture's loader resumes with ResumableDataCallback under a Lightning Trainer; its state (each"
                " source's pass and the weights in force) is not a sampler's state_dict, so this Fabric helper"
                " would lose it"
            )
        if isinstance(sampler, ResumableSampler):
            return sampler
    raise UnsupportedLoaderError(
        f"{type(loader).__name__} has no ResumableSampler: build the DataLoader with"
        " sampler=ResumableSampler(dataset, seed=..., batch_size=<the loader's batch_size>)"
    )


def loader_state(loader: object, batches: int) -> dict[str, Any]:
    """The position to save after ``batches`` batches of the current epoch were trained (counted from
    the epoch's start, batches before a restore included). The same on every rank: the position is
    global, so rank 0's copy (what ``fabric.save`` writes) is every rank's.

    Raises:
        UnsupportedLoaderError: the loader has no `ResumableSampler`.
    """
    return _sampler_of(loader).state_dict(batches)


def restore_loader(loader: object, state: Mapping[str, Any]) -> tuple[int, int]:
    """Restore a loader's position from `loader_state`'s ``state``, before its next pass; the ``(epoch,
    batches)`` the loop continues at. A state saved after its epoch's last batch continues at the
    start of the next epoch.

    Raises:
        UnsupportedLoaderError: the loader has no `ResumableSampler`.
        StateFormatError: ``state`` is malformed.
        IncompatibleStateError: the state was saved with another dataset size, shuffle, drop_last or batch size.
    """
    sampler = _sampler_of(loader)
    sampler.load_state_dict(state)
    epoch, position, batches = sampler.origin
    if position >= sampler.stream_length:  # the epoch was complete: go on with the next one
        epoch, batches = epoch + 1, 0
        sampler.set_epoch(epoch)
    set_fabric_pass_count(loader, epoch)
    return epoch, batches
