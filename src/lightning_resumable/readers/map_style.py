"""torch's map-style loaders: a user's train ``DataLoader`` rebuilt around a `ResumableSampler`.

Promise: the rebuilt loader reads the same dataset with the same batch size, workers, collation,
pinning and ``drop_last``; only the sampler changes, and the dataset is wrapped in a
`SampleSeededDataset` so that each sample is fetched under the seed of its global position. A
sampler or batch sampler other than torch's standard ones and `ResumableBatchSampler` subclasses,
or a ``DataLoader`` subclass whose constructor Lightning cannot replay, is refused with
`UnsupportedLoaderError` rather than silently resumed wrong. ``DataLoader`` subclasses are built
again by Lightning's own re-instantiation (`lightning_resumable.internals._lightning.reinstantiate_loader`).
A dataset with its own ``state_dict``/``load_state_dict`` is kept; the callback persists its state.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)
from torchdata.stateful_dataloader.sampler import RandomSampler as TorchdataRandomSampler

from lightning_resumable.core.batches import BatchDraws, ResumableBatchSampler
from lightning_resumable.core.draws import (
    Draws,
    Permutation,
    RepeatedPermutation,
    SubsetPermutation,
    UniformDraws,
    WeightedDraws,
)
from lightning_resumable.core.randomness import SampleSeededDataset
from lightning_resumable.core.sampler import ResumableSampler
from lightning_resumable.errors import UnsupportedLoaderError
from lightning_resumable.internals._lightning import reinstantiate_loader
from lightning_resumable.readers.base import BuildOptions, Built
from lightning_resumable.readers.settings import TORCH_SETTINGS, forwarded_settings
from lightning_resumable.readers.workers import WorkerSafeDataLoader, worker_safe

__all__ = ["build", "rebuilt_loader", "recognises"]


def recognises(loader: object) -> bool:
    """A torch loader over a map-style (sized, indexed) dataset."""
    return isinstance(loader, DataLoader) and not isinstance(loader.dataset, IterableDataset)


def build(loader: DataLoader[Any], options: BuildOptions, subclass: bool) -> Built:
    """``loader`` rebuilt around a keyed `ResumableSampler` and a `SampleSeededDataset` (``subclass``: its
    class is a user's ``DataLoader`` subclass, built again by Lightning).

    Raises:
        UnsupportedLoaderError: the loader cannot be made exactly resumable; the message says why.
    """
    if subclass and isinstance(loader.batch_sampler, ResumableBatchSampler):
        raise UnsupportedLoaderError(
            f"train_dataloader() returned a {type(loader).__name__} (a DataLoader subclass) with a"
            " ResumableBatchSampler; return a DataLoader or StatefulDataLoader with it"
        )
    dataset = loader.dataset
    if callable(getattr(dataset, "state_dict", None)) != callable(getattr(dataset, "load_state_dict", None)):
        raise UnsupportedLoaderError(
            f"the dataset {type(dataset).__name__} has only one of state_dict/load_state_dict; its state could be"
            " saved but not restored, or the reverse"
        )
    dataset_size = len(dataset)  # type: ignore[arg-type]  # map-style datasets are sized
    if isinstance(loader.batch_sampler, ResumableBatchSampler):
        return Built(_batch_stream_loader(loader, loader.batch_sampler, options, dataset_size))
    if loader.batch_size is None:
        raise UnsupportedLoaderError(
            f"the train loader uses a custom batch_sampler ({type(loader.batch_sampler).__name__}) or"
            " batch_size=None; subclass lightning_resumable.ResumableBatchSampler, or pass batch_size and a sampler"
        )
    draws = _draws_of(loader.sampler, dataset_size)
    sampler = ResumableSampler(
        dataset,  # type: ignore[arg-type]
        num_replicas=options.num_replicas,
        rank=options.rank,
        seed=options.seed,
        # A user's DistributedSampler(drop_last=True) drops the tail that does not divide across ranks.
        drop_last=isinstance(loader.sampler, DistributedSampler) and bool(loader.sampler.drop_last),
        batch_size=loader.batch_size,
        draws=draws,
        sample_keys=True,
        drop_last_batch=bool(loader.drop_last),
    )
    seeded = SampleSeededDataset(dataset, seed_globals=options.seed_samples, restore_globals=options.restore_globals)
    if subclass:
        try:
            return Built(worker_safe(reinstantiate_loader(loader, seeded, sampler)))
        except ValueError as error:
            raise UnsupportedLoaderError(
                f"train_dataloader() returned a {type(loader).__name__}, a DataLoader subclass that Lightning"
                f" cannot build again with another sampler: {error}"
            ) from error
    return Built(rebuilt_loader(loader, seeded, sampler, batch_size=loader.batch_size, collate_fn=loader.collate_fn))


def _draws_of(sampler: object, dataset_size: int) -> Draws:
    """Counter-based draws with the distribution of the user's sampler; refuses samplers we cannot reproduce.

    The sampler's own ``generator`` is not used: the draws are keyed by the run's seed.
    """
    if isinstance(sampler, (RandomSampler, TorchdataRandomSampler)):
        num_samples = int(sampler.num_samples)
        if sampler.replacement:
            return UniformDraws(dataset_size, num_samples)
        if num_samples != dataset_size:
            return RepeatedPermutation(dataset_size, num_samples)
        return Permutation(dataset_size, shuffle=True)
    if isinstance(sampler, SequentialSampler):
        return Permutation(dataset_size, shuffle=False)
    if isinstance(sampler, ResumableSampler):
        return sampler.draws
    if isinstance(sampler, DistributedSampler):
        return Permutation(dataset_size, shuffle=bool(sampler.shuffle))
    if isinstance(sampler, WeightedRandomSampler):
        return WeightedDraws(sampler.weights, sampler.num_samples, sampler.replacement)
    if isinstance(sampler, SubsetRandomSampler):
        return SubsetPermutation(list(sampler.indices), dataset_size)
    raise UnsupportedLoaderError(
        f"the train loader's sampler is a {type(sampler).__name__}; shuffle=True/False, RandomSampler (with or"
        " without replacement and num_samples), SequentialSampler, DistributedSampler, WeightedRandomSampler and"
        " SubsetRandomSampler can be made resumable"
    )


def _already_collated(batch: Any) -> Any:
    """The collate_fn of a loader whose dataset returns whole, collated batches."""
    return batch


def _batch_stream_loader(
    loader: DataLoader[Any],
    batch_sampler: ResumableBatchSampler,
    options: BuildOptions,
    dataset_size: int,
) -> DataLoader[Any]:
    """A loader over a batch sampler's global stream: each sampler element is one batch of keys
    (``batch_size=None``), fetched and collated by the dataset wrapper, in the worker."""
    sampler = ResumableSampler(
        loader.dataset,  # type: ignore[arg-type]
        num_replicas=options.num_replicas,
        rank=options.rank,
        seed=options.seed,
        drop_last=bool(getattr(batch_sampler, "drop_last", False)),
        batch_size=1,  # a step is one element of the stream
        draws=BatchDraws(batch_sampler, dataset_size),
        sample_keys=True,
    )
    seeded = SampleSeededDataset(
        loader.dataset,
        seed_globals=options.seed_samples,
        restore_globals=options.restore_globals,
        collate_fn=loader.collate_fn,
    )
    return rebuilt_loader(loader, seeded, sampler, batch_size=None, collate_fn=_already_collated)


def rebuilt_loader(
    loader: DataLoader[Any],
    dataset: SampleSeededDataset[Any],
    sampler: ResumableSampler,
    batch_size: int | None,
    collate_fn: Any,
) -> DataLoader[Any]:
    """``loader`` with another dataset, sampler and collation; every other setting kept."""
    drop_last = loader.drop_last if batch_size is not None else False
    settings = forwarded_settings(
        loader, TORCH_SETTINGS, batch_size=batch_size, collate_fn=collate_fn, drop_last=drop_last
    )
    return WorkerSafeDataLoader(dataset, sampler=sampler, **settings)
