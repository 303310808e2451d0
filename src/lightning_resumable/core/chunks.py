"""A chunked source's pass order: chunks permuted, samples permuted within windows of a few chunks.

Promise: a source stored in chunks (LitData's chunks, Mosaic's shards, Arrow record batches, or sizes
a user declares) is read pass by pass in an order that is a pure function of (seed, the source's name,
pass, the chunk sizes, the window): the chunks are permuted, consecutive permuted chunks form windows
of ``window`` chunks, and the samples of each window are permuted among themselves. So a pass reads one
window after the other, and any stretch of the pass touches the chunks of at most two windows (one at
its boundary), whichever rank or worker reads which position.

Cost: building a pass's order is O(chunks) (one keyed permutation of the chunk indices and the prefix
sums of the permuted sizes), never O(samples); a position then costs two binary searches over the
chunks and a keyed permutation of its window (`lightning_resumable.core.order.orders_at`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset

from lightning_resumable.core.order import MAX_SIZE, orders_at, round_keys
from lightning_resumable.errors import MixtureError
from lightning_resumable.internals._chunk_tables import library_chunk_sizes

__all__ = ["DEFAULT_WINDOW", "Chunked", "ChunkedPass", "Chunks", "chunks_of"]

DEFAULT_WINDOW = 4
"""Chunks whose samples are mixed with each other: a reader holds this many chunks of a source at a
time (twice as many where a window ends), and a window of 4 LitData chunks of 64 MB is 256 MB."""


@dataclass(frozen=True)
class Chunks:
    """A source's chunks: their sizes (samples) in the source's order, mixed ``window`` at a time (an empty
    chunk, as a subsample or a writer may leave, is kept: the chunks keep their library's numbering).

    Raises:
        MixtureError: no sample, a size that is not a non-negative int, a window below 1, or over 2**40 samples.
    """

    sizes: tuple[int, ...]
    window: int = DEFAULT_WINDOW

    def __post_init__(self) -> None:
        if not all(type(size) is int and size >= 0 for size in self.sizes) or not any(self.sizes):
            raise MixtureError(f"a source's chunk sizes must be non-negative ints, not all 0, got {self.sizes!r:.120}")
        if type(self.window) is not int or self.window < 1:
            raise MixtureError(f"a chunked source's window must be a positive int (chunks), got {self.window!r}")
        if sum(self.sizes) > MAX_SIZE:
            raise MixtureError(f"a chunked source holds at most 2**40 samples, got {sum(self.sizes)}")

    @property
    def total(self) -> int:
        return sum(self.sizes)

    def digest(self) -> str:
        """What the order depends on besides seed, name and pass: a checkpoint keeps it, so a source
        whose chunks changed (written again with another chunk size) is refused, not read in another order."""
        material = ",".join(map(str, self.sizes)) + f"/{self.window}"
        return f"{len(self.sizes)}x{self.window}:" + hashlib.blake2b(material.encode(), digest_size=8).hexdigest()


class ChunkedPass:
    """One pass's order over a chunked source: ``order(within)`` maps places in the pass to indices.

    Args:
        chunks: the source's chunks.
        seed_of: the seed of a level of this pass (`lightning_resumable.format._keys.chunked_pass_seed`
            with seed, source and pass bound): level 0 permutes the chunks, level ``1 + k`` window ``k``.
    """

    def __init__(self, chunks: Chunks, seed_of: Callable[[int], int]) -> None:
        sizes = torch.tensor(chunks.sizes, dtype=torch.int64)
        count = len(chunks.sizes)
        self._seed_of = seed_of
        self._window_keys: dict[int, list[int]] = {}
        self.offsets = torch.cumsum(sizes, 0) - sizes  # each chunk's first index, in the source's order
        everywhere = torch.full((count,), count, dtype=torch.int64)
        chunk_keys = torch.tensor([round_keys(seed_of(0), 0)], dtype=torch.int64).expand(count, -1)
        self.chunk_order = orders_at(torch.arange(count, dtype=torch.int64), everywhere, chunk_keys)
        permuted = sizes[self.chunk_order]
        self.starts = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(permuted, 0)])  # in the pass
        self.window_starts = self.starts[:: chunks.window].contiguous()
        if self.window_starts[-1] != self.starts[-1]:
            self.window_starts = torch.cat([self.window_starts, self.starts[-1:]])

    def window_keys(self, window: int) -> list[int]:
        if window not in self._window_keys:
            self._window_keys[window] = round_keys(self._seed_of(1 + window), 0)
        return self._window_keys[window]

    def __call__(self, within: torch.Tensor) -> torch.Tensor:
        """The source's index at each place ``within`` of the pass (an int64 tensor of places in ``[0, total)``)."""
        window = torch.searchsorted(self.window_starts, within, right=True) - 1
        first = self.window_starts[window]
        sizes = self.window_starts[window + 1] - first
        windows, which = torch.unique(window, return_inverse=True)
        keys = torch.tensor([self.window_keys(number) for number in windows.tolist()], dtype=torch.int64)[which]
        in_pass = first + orders_at(within - first, sizes, keys)
        chunk = torch.searchsorted(self.starts, in_pass, right=True) - 1
        return self.offsets[self.chunk_order[chunk]] + (in_pass - self.starts[chunk])


class Chunked(Dataset[Any]):
    """A map-style dataset stored in chunks: declare their sizes to have a `Mixture` read it chunk by chunk.

    LitData's and MosaicML Streaming's ``StreamingDataset`` and a Hugging Face ``datasets.Dataset`` are
    recognised without it (`chunks_of`); wrap one to choose the window, or an Arrow dataset's chunk size.

    Args:
        dataset: the samples (sized and indexable; indices run through the chunks in order).
        chunk_sizes: the samples of each chunk, in the dataset's order (they must add up to its length);
            one int: chunks of that many samples, the last one shorter; ``None``: the data library's.
        window: chunks whose samples are mixed with each other (`DEFAULT_WINDOW`).

    Raises:
        MixtureError: sizes that do not add up to the dataset's length, or malformed.
    """

    def __init__(
        self, dataset: Any, chunk_sizes: Sequence[int] | int | None = None, window: int = DEFAULT_WINDOW
    ) -> None:
        self.dataset = dataset
        self.window = window
        self.declared: Chunks | None = None
        length = len(dataset)
        if isinstance(chunk_sizes, int):
            if type(chunk_sizes) is not int or chunk_sizes < 1:
                raise MixtureError(f"a chunk size must be a positive int, got {chunk_sizes!r}")
            chunk_sizes = [min(chunk_sizes, length - start) for start in range(0, length, chunk_sizes)]
        if chunk_sizes is not None:
            self.declared = Chunks(tuple(chunk_sizes), window)
            if self.declared.total != length:
                raise MixtureError(
                    f"the chunk sizes add up to {self.declared.total} samples, but the dataset holds {length}"
                )
        elif type(window) is not int or window < 1:
            raise MixtureError(f"a chunked source's window must be a positive int (chunks), got {window!r}")

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]


def chunks_of(source: object, name: str) -> Chunks | None:
    """The chunks ``source`` (a mixture's source ``name``) is read by, or ``None`` (a global permutation):
    a `Chunked` source's; LitData's ``StreamingDataset`` (its chunks' regions of interest: ``subsample``
    respected; a ``TokensLoader`` dataset's chunks hold ``tokens // block_size`` blocks); MosaicML
    Streaming's (its shards); a Hugging Face ``datasets.Dataset`` (its Arrow record batches).

    Raises:
        MixtureError: a `Chunked` source without sizes over a dataset that does not know its chunks.
    """
    if isinstance(source, Chunked):
        if source.declared is not None:
            return source.declared
        sizes = library_chunk_sizes(source.dataset, name)
        if sizes is None:
            raise MixtureError(
                f"the source {name!r} wraps a {type(source.dataset).__name__} in Chunked without chunk_sizes,"
                " and it is not a dataset whose chunks are known (LitData, MosaicML Streaming, Arrow): pass them"
            )
        return Chunks(sizes, source.window)
    sizes = library_chunk_sizes(source, name)
    return None if sizes is None else Chunks(sizes, DEFAULT_WINDOW)
