"""The chunk tables of the data libraries' datasets: the one place that reads them.

LitData's ``StreamingDataset.region_of_interest`` (per chunk, the ``(start, end)`` of the samples it
reads: ``subsample`` respected), MosaicML Streaming's ``StreamingDataset.samples_per_shard``, and a
Hugging Face ``datasets.Dataset``'s Arrow record batches (``data.to_batches()``) and indices mapping
(``_indices``). None of these libraries is imported: a dataset is recognised by the package its class
(or a base class) comes from. Tested against the versions CI installs (``tests/test_chunks.py``,
``tests/test_litdata_internals.py``, ``tests/test_mosaic_internals.py``).
"""

from __future__ import annotations

from lightning_resumable.errors import MixtureError

__all__ = ["is_of", "library_chunk_sizes"]


def is_of(node: object, package: str, name: str) -> bool:
    """Whether ``node`` is of class ``name`` (``StreamingDataLoader``, ``StreamingDataset``) from ``package``
    (``litdata``, ``streaming``), or of a subclass of it."""
    return any(cls.__name__ == name and cls.__module__.partition(".")[0] == package for cls in type(node).__mro__)


def library_chunk_sizes(source: object, name: str) -> tuple[int, ...] | None:
    """The samples of each chunk of ``source`` (a mixture's source ``name``) in its order, if it is a
    data library's chunked dataset; else ``None``. A LitData or Mosaic dataset's ``len`` is one rank's
    share under DDP; these add up to all its samples, which its ``__getitem__`` indexes.

    Raises:
        MixtureError: an Arrow dataset read through an indices mapping (its rows are not in chunk order).
    """
    if is_of(source, "litdata", "StreamingDataset"):
        return tuple(int(end) - int(start) for start, end in source.region_of_interest)  # type: ignore[attr-defined]
    if is_of(source, "streaming", "StreamingDataset"):
        return tuple(int(size) for size in source.samples_per_shard)  # type: ignore[attr-defined]
    if is_of(source, "datasets", "Dataset"):
        if getattr(source, "_indices", None) is not None:
            raise MixtureError(
                f"the source {name!r} is a Hugging Face Dataset read through an indices mapping (after shuffle,"
                " select or filter): its rows are not in its chunks' order; call .flatten_indices() on it, or"
                " wrap it in Chunked(dataset, chunk_sizes=...) to declare chunks of its indices"
            )
        return tuple(int(batch.num_rows) for batch in source.data.to_batches())  # type: ignore[attr-defined]
    return None
