"""LitData's ``CombinedStreamingDataset(iterate_over_all=False)`` read as the equivalent `Mixture`, and what a refused
combined dataset's message prints to write instead (`lightning_resumable.readers.litdata` builds it)."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from litdata import StreamingDataLoader, StreamingDataset
from litdata.streaming import dataloader as litdata_dataloader
from torch.utils.data import default_collate

from lightning_resumable.core.mixture import Mixture
from lightning_resumable.errors import UnsupportedLoaderError
from lightning_resumable.readers.settings import DATA_LIBRARY_SETTINGS, forwarded_settings

__all__ = ["combined_as_mixture", "mixture_to_write", "source_names", "users_collate_fn"]


def source_names(datasets: list[Any]) -> list[str]:
    """A name for each of a combined dataset's datasets: its directory's last part, numbered where two share it."""
    names = [
        PurePosixPath(str(each.input_dir.url or each.input_dir.path or "source").rstrip("/")).name for each in datasets
    ]
    return [f"{name}-{number}" if names.count(name) > 1 else name for number, name in enumerate(names)]


def users_collate_fn(loader: Any) -> Any:
    """The collation the user gave ``loader`` (LitData's loader wraps it in its own)."""
    return loader.collate_fn.collate_fn if isinstance(loader, StreamingDataLoader) else loader.collate_fn


def mixture_to_write(names: list[str], weights: list[float], loader: Any, shuffle: bool) -> str:
    sources = ", ".join(f"{name!r}: StreamingDataset(...)" for name in names)
    shares = ", ".join(f"{name!r}: {weight:.4g}" for name, weight in zip(names, weights, strict=True))
    collate_fn = users_collate_fn(loader)
    defaults = (default_collate, getattr(litdata_dataloader, "litdata_collate", default_collate))
    collation = "" if collate_fn in defaults else f", collate_fn={getattr(collate_fn, '__qualname__', collate_fn)}"
    return (
        f"DataLoader(Mixture({{{sources}}}, {{{shares}}}{'' if shuffle else ', shuffle=False'}),"
        f" batch_size={loader.batch_size}, num_workers={loader.num_workers}{collation})"
    )


def combined_as_mixture(loader: Any) -> tuple[Mixture, dict[str, Any]]:
    """A loader over a ``CombinedStreamingDataset(datasets, weights, seed, iterate_over_all=False)`` as the
    equivalent `Mixture` (its datasets by `source_names`, its weights; read chunk by chunk) and the
    settings of the torch loader that reads it (batch size, workers, collation: the user's).

    Raises:
        UnsupportedLoaderError: what the mixture cannot honour (batches of one dataset each, datasets
            shuffled and not, a DataLoader subclass), printing the loader to write instead.
    """
    combined = loader.dataset
    datasets, weights = list(combined._datasets), [float(weight) for weight in combined._weights]
    names = source_names(datasets)
    shuffles = {bool(each.shuffle) for each in datasets}
    written = mixture_to_write(names, weights, loader, shuffle=True in shuffles)
    why = ""
    if combined._batching_method != "stratified":
        why = f"batching_method={combined._batching_method!r} (a Mixture mixes its sources within each batch)"
    elif len(shuffles) > 1:
        why = "datasets of which some shuffle and some do not (a Mixture shuffles all its sources or none)"
    elif not all(isinstance(each, StreamingDataset) for each in datasets):
        why = "a dataset that is not a StreamingDataset"
    if why:
        raise UnsupportedLoaderError(
            f"LitData's CombinedStreamingDataset with {why} cannot be read as a Mixture; write {written}"
        )
    collate_fn = users_collate_fn(loader)
    mixture = Mixture(
        dict(zip(names, datasets, strict=True)), dict(zip(names, weights, strict=True)), shuffle=True in shuffles
    )
    return mixture, forwarded_settings(loader, DATA_LIBRARY_SETTINGS, collate_fn=collate_fn)
