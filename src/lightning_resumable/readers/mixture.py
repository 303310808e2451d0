"""A `Mixture` in a torch loader: the loader rebuilt around the mixture's own sampler.

Promise: the rebuilt loader reads the mixture with the user's batch size, workers, collation and
pinning; the order is the mixture's (`MixtureSampler`), each sample fetched under the seed of its
stream position (a `SampleSeededDataset`). A sampler or batch sampler of the user's own, a loader
subclass, or ``batch_size=None`` is refused with `UnsupportedLoaderError`: the mixture decides the
order, and a second order would be silently dropped.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from lightning_resumable.core.chunks import Chunked, Chunks
from lightning_resumable.core.mixture import Mixture
from lightning_resumable.core.mixture_sampler import MixtureSampler
from lightning_resumable.core.randomness import SampleSeededDataset
from lightning_resumable.errors import UnsupportedLoaderError
from lightning_resumable.internals._lightning import given_arguments
from lightning_resumable.readers.base import BuildOptions, Built
from lightning_resumable.readers.libraries import adapter_of
from lightning_resumable.readers.map_style import rebuilt_loader

__all__ = ["build", "readable", "recognises"]


def recognises(loader: object) -> bool:
    """A torch loader over a `Mixture`."""
    return isinstance(loader, DataLoader) and isinstance(loader.dataset, Mixture)


def readable(source: object, chunks: Chunks | None) -> object:
    """``source`` as a mixture reads it by index: a data library's chunked dataset as its adapter reads it
    (LitData's chunk by chunk, without a scan of its chunk table or bookkeeping at each change of
    chunk), any other as it is."""
    inner = source.dataset if isinstance(source, Chunked) else source
    adapter = adapter_of(inner)
    return source if adapter is None or chunks is None else adapter.mixture_source(inner, chunks.window)


def build(loader: DataLoader[Any], options: BuildOptions, subclass: bool) -> Built:
    """``loader`` rebuilt around a `MixtureSampler` (``subclass``: its class is a ``DataLoader`` subclass).

    Raises:
        UnsupportedLoaderError: the loader sets an order of its own, or cannot be rebuilt.
    """
    mixture = loader.dataset
    assert isinstance(mixture, Mixture)
    if subclass:
        raise UnsupportedLoaderError(
            f"train_dataloader() returned a {type(loader).__name__} (a DataLoader subclass) over a Mixture; return a"
            " DataLoader or StatefulDataLoader with it"
        )
    sampler, given = loader.sampler, given_arguments(loader)
    # A loader built in the hook says what it was given; one built elsewhere, only that its sampler is the default.
    ordered = [
        name
        for name in ("shuffle", "sampler", "batch_sampler")
        if given and (given.get(name) if name == "shuffle" else given.get(name) is not None)
    ]
    default_order = not ordered and type(sampler) is SequentialSampler
    if not default_order or type(loader.batch_sampler) is not BatchSampler or loader.batch_size is None:
        named = ", ".join(f"{name}={given[name]!r:.60}" for name in ordered) if given else type(sampler).__name__
        raise UnsupportedLoaderError(
            f"the train loader over a Mixture sets its own order ({named or type(sampler).__name__},"
            f" {type(loader.batch_sampler).__name__}, batch_size={loader.batch_size}); a Mixture draws its sources"
            " in the order its weights give: pass batch_size and leave sampler, batch_sampler and shuffle unset"
        )
    mixture = mixture.reading(
        {name: readable(source, mixture.chunks.get(name)) for name, source in mixture.sources.items()}
    )
    mixture_sampler = MixtureSampler(
        mixture, num_replicas=options.num_replicas, rank=options.rank, seed=options.seed, batch_size=loader.batch_size
    )
    seeded = SampleSeededDataset(mixture, seed_globals=options.seed_samples, restore_globals=options.restore_globals)
    built = rebuilt_loader(loader, seeded, mixture_sampler, batch_size=loader.batch_size, collate_fn=loader.collate_fn)
    return Built(built, mixture=mixture_sampler)
