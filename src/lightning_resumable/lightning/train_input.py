"""The train input ``train_dataloader()`` returned, made resumable: its loaders rebuilt, and the owner
of their position, picked here once from what was built (one map-style loader, several, a stream).

Promise: `build_train_input` returns the owner with the loaders it owns and what the trainer iterates
(the loader, or the user's list, dict or ``CombinedLoader`` rebuilt around them); nothing downstream
tells the kinds apart again.
"""

from __future__ import annotations

import os
import random

import lightning.pytorch as pl
from torch.utils.data import DataLoader, IterableDataset

from lightning_resumable.core.batches import ResumableBatchSampler
from lightning_resumable.core.mixture import Mixture
from lightning_resumable.errors import UnsupportedLoaderError
from lightning_resumable.lightning.combined import key_seed, refuse_cycles_a_reload_prefetches, split_train_loaders
from lightning_resumable.lightning.mixture_owner import MixtureOwner
from lightning_resumable.lightning.owners import LoaderOwner, LoadersOwner
from lightning_resumable.lightning.stream_owner import StreamOwner
from lightning_resumable.readers.build import BuildOptions, Built, build_resumable
from lightning_resumable.readers.worker_starts import refuse_unpicklable

__all__ = ["TrainOwner", "build_train_input", "run_seed"]

TrainOwner = LoaderOwner | LoadersOwner | StreamOwner | MixtureOwner
"""The owner of any kind of train input."""


def run_seed(trainer: pl.Trainer) -> int:
    """A fresh run's shuffle seed: ``seed_everything``'s (``PL_GLOBAL_SEED``), else one drawn by rank 0 for all."""
    global_seed = os.environ.get("PL_GLOBAL_SEED")
    if global_seed is not None:
        return int(global_seed)
    return int(trainer.strategy.broadcast(random.SystemRandom().randrange(2**31), src=0))


def build_train_input(
    returned: object,
    trainer: pl.Trainer,
    seed: int,
    *,
    seed_samples: bool,
    seed_steps: bool,
) -> tuple[TrainOwner, object]:
    """The owner of ``returned``'s position, and what the trainer iterates instead of ``returned``.

    ``seed``: the run's shuffle seed (each of several loaders gets one of its own, from it and its key);
    the options are the callback's.

    Raises:
        UnsupportedLoaderError: a loader cannot be made exactly resumable; the message says why.
    """

    def built(each: object, each_seed: int) -> Built:
        return build_resumable(
            each,
            BuildOptions(
                seed=each_seed,
                num_replicas=trainer.world_size,
                rank=trainer.global_rank,
                seed_samples=seed_samples,
                # Lightning fetches each batch before on_train_batch_start, where a reseeding callback
                # sets the step's stream anyway: putting the generators back would be wasted work.
                restore_globals=not seed_steps,
                epoch_source=lambda: trainer.current_epoch,
            ),
        )

    several = split_train_loaders(returned)
    if several is None:
        one = built(returned, seed)
        refuse_unpicklable(one.loader, "the train loader")
        if one.stream is not None:
            return StreamOwner(one.stream, trainer.global_rank, trainer.world_size, seed_samples), one.loader
        if one.mixture is not None:
            return MixtureOwner(one.loader), one.loader
        return LoaderOwner(one.loader), one.loader
    loaders, mode, rebuild = several
    for key, each in loaders.items():
        _refuse_among_several(key, each)
    rebuilt = {key: built(each, key_seed(seed, key)).loader for key, each in loaders.items()}
    for key, each in rebuilt.items():
        refuse_unpicklable(each, f"train loader {key!r}")
    reload_every = getattr(trainer, "reload_dataloaders_every_n_epochs", 0)  # the Trainer argument, set at its init
    refuse_cycles_a_reload_prefetches(rebuilt, mode, reload_every)
    return LoadersOwner(rebuilt, mode, seed), rebuild(rebuilt)


def _refuse_among_several(key: str, loader: object) -> None:
    """What several train loaders cannot hold yet: a stream, a mixture, or a batch sampler (whose epochs may
    differ in length)."""
    if isinstance(loader, DataLoader) and isinstance(loader.dataset, Mixture):
        raise UnsupportedLoaderError(
            f"the train loader {key!r} reads a Mixture; a Mixture is supported as the only train loader: put every"
            " source in it"
        )
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
