"""Turn a user's train ``DataLoader`` into one driven by a `ResumableSampler`.

Promise: the rebuilt loader reads the same dataset with the same batch size, workers, collation,
pinning and ``drop_last``; only the sampler changes, and the dataset is wrapped in a
`SampleSeededDataset` so that each sample is fetched under the
seed of its global position. Anything whose stream we cannot reproduce
exactly (a sampler or batch sampler other than torch's standard ones and
`ResumableBatchSampler` subclasses, an iterable dataset without state, a
``DataLoader`` subclass whose constructor Lightning cannot replay) is refused with `UnsupportedLoaderError`
rather than silently resumed wrong. ``DataLoader`` subclasses are built again by Lightning's own
re-instantiation (see `lightning_resumable.internals._lightning.reinstantiate_loader`).
A dataset with its own ``state_dict``/``load_state_dict`` is kept; the callback persists its state.
A loader over an iterable dataset with state becomes a
`StreamLoader` (`make_stream_resumable`; see `lightning_resumable.readers.streams`), LitData's
``StreamingDataLoader`` a `lightning_resumable.readers.litdata.LitDataLoader`, and MosaicML Streaming's a
`lightning_resumable.readers.mosaic.MosaicLoader`.

A ``StatefulDataLoader`` is rebuilt as a plain ``DataLoader``: the callback owns the position, so
torchdata's own snapshots would be a second owner (the double count of Accelerate #3938) and cost
time on every step (torchdata #1317).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
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
from torchdata.stateful_dataloader import StatefulDataLoader
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
from lightning_resumable.readers.contract import pipeline
from lightning_resumable.readers.hugging_face import shuffle_buffer_size
from lightning_resumable.readers.libraries import is_of, refuse_unsupported
from lightning_resumable.readers.settings import TORCH_SETTINGS, forwarded_settings, refuse_persistent_workers
from lightning_resumable.readers.streams import SeededStream, StreamLoader, StreamReader
from lightning_resumable.readers.workers import WorkerSafeDataLoader, worker_safe

__all__ = ["Built", "build_resumable", "make_resumable"]

_STREAM_SETTINGS = tuple(name for name in TORCH_SETTINGS if name != "in_order")
"""A stream loader's: ``in_order=False`` is refused, and torchdata 0.10's loader does not take it."""


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


@dataclass(frozen=True)
class Built:
    """A resumable train loader and the kind it was built as: ``stream`` is the loader itself when it
    reads a stream (a `StreamReader`), ``None`` for a map-style loader with a `ResumableSampler`."""

    loader: DataLoader[Any]
    stream: StreamReader | None = None


def make_resumable(loader: object, **options: Any) -> DataLoader[Any]:
    """`build_resumable`'s loader (``options`` are its keyword arguments)."""
    return build_resumable(loader, **options).loader


def build_resumable(
    loader: object,
    *,
    seed: int,
    num_replicas: int,
    rank: int,
    seed_samples: bool = True,
    restore_globals: bool = True,
    epoch_source: Callable[[], int] = lambda: 0,
    allow_inexact_streams: bool = False,
) -> Built:
    """Return ``loader`` rebuilt around a keyed `ResumableSampler` and a `SampleSeededDataset`, with the
    kind of loader it was built as (decided here, once).

    ``seed_samples=False`` leaves the global generators alone while fetching (``sample_rng()`` still
    works); ``restore_globals`` is the wrapper's (see `SampleSeededDataset`). A loader that
    this function built already is returned as it is. ``epoch_source`` gives a stream loader the
    trainer's epoch at each ``iter()``.

    Raises:
        UnsupportedLoaderError: the loader cannot be made exactly resumable; the message says why.
    """
    if isinstance(loader, StreamReader):
        return Built(loader, loader)  # type: ignore[arg-type]  # built by this function already
    torch_loader = type(loader) in (DataLoader, StatefulDataLoader)
    dataset = getattr(loader, "dataset", None)
    litdata_dataset = any(is_of(dataset, "litdata", name) for name in ("StreamingDataset", "CombinedStreamingDataset"))
    if is_of(loader, "litdata", "StreamingDataLoader") or (torch_loader and litdata_dataset):
        from lightning_resumable.readers.litdata import make_litdata_resumable  # imports litdata: only when used

        litdata_loader = make_litdata_resumable(loader, seed=seed, epoch_source=epoch_source)
        return Built(litdata_loader, litdata_loader)
    if is_of(loader, "streaming", "StreamingDataLoader") or (
        torch_loader and is_of(dataset, "streaming", "StreamingDataset")
    ):
        from lightning_resumable.readers.mosaic import make_mosaic_resumable  # imports streaming: only when used

        mosaic_loader = make_mosaic_resumable(
            loader, seed=seed, epoch_source=epoch_source, rank=rank, world_size=num_replicas
        )
        return Built(mosaic_loader, mosaic_loader)
    refuse_unsupported(pipeline(loader))  # a data library's own loader or dataset, named as such
    if not isinstance(loader, DataLoader):
        raise UnsupportedLoaderError(
            f"train_dataloader() returned a {type(loader).__name__}; a ResumableDataModule supports torch"
            " DataLoaders and torchdata StatefulDataLoaders: one, or a list, dict or CombinedLoader of them"
        )
    if isinstance(loader.dataset, (SampleSeededDataset, SeededStream)):
        return Built(loader)  # built already (a stream's loader is a StreamReader, returned above)
    subclass = type(loader) not in (DataLoader, StatefulDataLoader)
    if subclass and callable(getattr(loader, "state_dict", None)):
        raise UnsupportedLoaderError(
            f"train_dataloader() returned a {type(loader).__name__}, a loader with a state_dict of its own: it would"
            " be a second owner of the stream's position, restored by Lightning as well; return a DataLoader or"
            " StatefulDataLoader (rebuilt as a DataLoader, whose position the callback owns)"
        )
    if subclass and isinstance(loader.batch_sampler, ResumableBatchSampler):
        raise UnsupportedLoaderError(
            f"train_dataloader() returned a {type(loader).__name__} (a DataLoader subclass) with a"
            " ResumableBatchSampler; return a DataLoader or StatefulDataLoader with it"
        )
    dataset = loader.dataset
    if isinstance(dataset, IterableDataset):
        if subclass:
            raise UnsupportedLoaderError(
                f"train_dataloader() returned a {type(loader).__name__} over a stream; return a DataLoader or"
                " StatefulDataLoader over it"
            )
        stream_loader = make_stream_resumable(
            loader,
            seed=seed,
            rank=rank,
            seed_samples=seed_samples,
            restore_globals=restore_globals,
            epoch_source=epoch_source,
            allow_inexact=allow_inexact_streams,
        )
        return Built(stream_loader, stream_loader)
    if callable(getattr(dataset, "state_dict", None)) != callable(getattr(dataset, "load_state_dict", None)):
        raise UnsupportedLoaderError(
            f"the dataset {type(dataset).__name__} has only one of state_dict/load_state_dict; its state could be"
            " saved but not restored, or the reverse"
        )
    dataset_size = len(dataset)  # type: ignore[arg-type]  # map-style datasets are sized
    if isinstance(loader.batch_sampler, ResumableBatchSampler):
        return Built(
            _batch_stream_loader(
                loader, loader.batch_sampler, seed, num_replicas, rank, seed_samples, restore_globals, dataset_size
            )
        )
    if loader.batch_size is None:
        raise UnsupportedLoaderError(
            f"the train loader uses a custom batch_sampler ({type(loader.batch_sampler).__name__}) or"
            " batch_size=None; subclass lightning_resumable.ResumableBatchSampler, or pass batch_size and a sampler"
        )
    draws = _draws_of(loader.sampler, dataset_size)
    sampler = ResumableSampler(
        dataset,  # type: ignore[arg-type]
        num_replicas=num_replicas,
        rank=rank,
        seed=seed,
        # A user's DistributedSampler(drop_last=True) drops the tail that does not divide across ranks.
        drop_last=isinstance(loader.sampler, DistributedSampler) and bool(loader.sampler.drop_last),
        batch_size=loader.batch_size,
        draws=draws,
        sample_keys=True,
        drop_last_batch=bool(loader.drop_last),
    )
    seeded = SampleSeededDataset(dataset, seed_globals=seed_samples, restore_globals=restore_globals)
    if subclass:
        try:
            return Built(worker_safe(reinstantiate_loader(loader, seeded, sampler)))
        except ValueError as error:
            raise UnsupportedLoaderError(
                f"train_dataloader() returned a {type(loader).__name__}, a DataLoader subclass that Lightning"
                f" cannot build again with another sampler: {error}"
            ) from error
    return Built(_rebuilt(loader, seeded, sampler, batch_size=loader.batch_size, collate_fn=loader.collate_fn))


def _already_collated(batch: Any) -> Any:
    """The collate_fn of a loader whose dataset returns whole, collated batches."""
    return batch


def _batch_stream_loader(
    loader: DataLoader[Any],
    batch_sampler: ResumableBatchSampler,
    seed: int,
    num_replicas: int,
    rank: int,
    seed_samples: bool,
    restore_globals: bool,
    dataset_size: int,
) -> DataLoader[Any]:
    """A loader over a batch sampler's global stream: each sampler element is one batch of keys
    (``batch_size=None``), fetched and collated by the dataset wrapper, in the worker."""
    sampler = ResumableSampler(
        loader.dataset,  # type: ignore[arg-type]
        num_replicas=num_replicas,
        rank=rank,
        seed=seed,
        drop_last=bool(getattr(batch_sampler, "drop_last", False)),
        batch_size=1,  # a step is one element of the stream
        draws=BatchDraws(batch_sampler, dataset_size),
        sample_keys=True,
    )
    seeded = SampleSeededDataset(
        loader.dataset, seed_globals=seed_samples, restore_globals=restore_globals, collate_fn=loader.collate_fn
    )
    return _rebuilt(loader, seeded, sampler, batch_size=None, collate_fn=_already_collated)


def _rebuilt(
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


def make_stream_resumable(
    loader: DataLoader[Any],
    *,
    seed: int,
    rank: int,
    seed_samples: bool,
    restore_globals: bool,
    epoch_source: Callable[[], int],
    allow_inexact: bool = False,
) -> StreamLoader:
    """``loader`` (a ``DataLoader`` or ``StatefulDataLoader`` over a stateful ``IterableDataset``) as a
    `StreamLoader` over a `SeededStream`, every other setting kept.

    Raises:
        UnsupportedLoaderError: the stream has no state, or the loader has persistent workers (they
            keep the first epoch's copy of the stream) or ``in_order=False`` (its order is not
            reproducible), or the stream is known not to resume exactly (a Hugging Face stream with
            a shuffle buffer) and ``allow_inexact`` is not set.
    """
    dataset = loader.dataset
    buffer = shuffle_buffer_size(dataset)
    if buffer is not None and not allow_inexact:
        raise UnsupportedLoaderError(
            f"the train stream is a Hugging Face datasets.IterableDataset shuffled with a buffer of {buffer}"
            " samples; datasets does not save that buffer, so a resume loses the buffered samples and reads"
            " others (measured with buffer_size=16 on 2 ranks: 13 samples of the epoch lost, 5 read twice)."
            " Shuffle exactly instead: a map-style datasets.Dataset with DataLoader(shuffle=True), which"
            " this library resumes exactly; or keep the stream unshuffled. To train on it anyway, knowing"
            " resumes are not exact: ResumableDataCallback(allow_inexact_streams=True)"
        )
    if buffer is not None:
        warnings.warn(
            f"lightning_resumable: the train stream's shuffle buffer ({buffer} samples) is not saved: resuming"
            " it is not exact (allow_inexact_streams=True)",
            RuntimeWarning,
            stacklevel=2,
        )
    if not (callable(getattr(dataset, "state_dict", None)) and callable(getattr(dataset, "load_state_dict", None))):
        raise UnsupportedLoaderError(
            f"the train loader reads an IterableDataset ({type(dataset).__name__}) without state_dict/load_state_dict:"
            " its position cannot be saved, and replaying it from the start would not be exact. Give it"
            " state_dict()/load_state_dict() (torchdata's Stateful protocol), as Hugging Face's"
            " datasets.IterableDataset has"
        )
    refuse_persistent_workers(
        loader,
        "a stream loader",
        "each worker would keep its copy of the stream from the first epoch, so neither the epoch nor a"
        " restored state would reach it",
    )
    if not getattr(loader, "in_order", True):
        raise UnsupportedLoaderError(
            "a stream loader with in_order=False has no reproducible order; pass in_order=True"
        )
    stream = SeededStream(
        dataset,  # type: ignore[arg-type]
        seed=seed,
        rank=rank,
        seed_globals=seed_samples,
        restore_globals=restore_globals,
    )
    made = StreamLoader(
        stream,
        snapshot_every_n_steps=1,  # every worker's state with every batch: a restore replays nothing
        epoch_source=epoch_source,
        **forwarded_settings(loader, _STREAM_SETTINGS),
    )
    made.inexact = buffer is not None  # its resumes are not exact: not verified either
    return made
