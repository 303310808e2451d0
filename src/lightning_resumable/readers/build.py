"""A user's train loader made resumable: the one place the kind of loader is decided.

A loader this function built already is returned as it is; a data library's loader (or a torch loader
over its dataset) goes to its adapter (`lightning_resumable.readers.libraries` lists them); an object
of a data library anywhere else in the loader is refused, naming the way that works; then a torch
loader over a `Mixture` goes to `lightning_resumable.readers.mixture`, one over a stream to
`lightning_resumable.readers.streams`, one over a map-style dataset to
`lightning_resumable.readers.map_style`.

A ``StatefulDataLoader`` is rebuilt as a plain ``DataLoader``: the callback owns the position, so
torchdata's own snapshots would be a second owner (the double count of Accelerate #3938) and cost
time on every step (torchdata #1317).
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_resumable.core.randomness import SampleSeededDataset
from lightning_resumable.errors import UnsupportedLoaderError
from lightning_resumable.readers import map_style, mixture, streams
from lightning_resumable.readers.base import BuildOptions, Built, StreamReader
from lightning_resumable.readers.contract import pipeline
from lightning_resumable.readers.libraries import adapters_for, refuse_unsupported
from lightning_resumable.readers.streams import SeededStream

__all__ = ["BuildOptions", "Built", "build_resumable", "make_resumable"]


def make_resumable(loader: object, **options: Any) -> DataLoader[Any]:
    """`build_resumable`'s loader (``options``: `BuildOptions`' fields)."""
    return build_resumable(loader, BuildOptions(**options)).loader


def build_resumable(loader: object, options: BuildOptions) -> Built:
    """Return ``loader`` rebuilt to resume exactly, with the kind of loader it was built as.

    ``options.seed_samples=False`` leaves the global generators alone while fetching (``sample_rng()``
    still works); ``restore_globals`` is the wrapper's (see `SampleSeededDataset`); ``epoch_source``
    gives a stream loader the trainer's epoch at each ``iter()``.

    Raises:
        UnsupportedLoaderError: the loader cannot be made exactly resumable; the message says why.
    """
    if isinstance(loader, StreamReader):
        return Built(loader, loader)  # type: ignore[arg-type]  # built by this function already
    for adapter in adapters_for(loader):
        if adapter.recognises(loader):
            return adapter.build(loader, options)
    refuse_unsupported(pipeline(loader))  # a data library's object elsewhere in the loader, named as such
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
    if mixture.recognises(loader):
        return mixture.build(loader, options, subclass)
    if streams.recognises(loader):
        return streams.build(loader, options, subclass)
    return map_style.build(loader, options, subclass)
