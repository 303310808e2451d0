"""A Hugging Face stream's shuffle buffer, replaced by windows that resume from a few integers.

Promise: a ``datasets.IterableDataset`` shuffled with ``.shuffle(seed, buffer_size)`` (before or after
``map``, ``filter``, ``split_dataset_by_node``, inside ``interleave_datasets``) resumes exactly: each
``BufferShuffledExamplesIterable`` of its chain becomes a `WindowShuffledExamplesIterable`, which reads
what the buffer would have read (up to ``max_buffer_input_shards`` shards side by side, as ``datasets``
interleaves them, but read in this thread: ``datasets`` reads them ahead in a thread pool, where what a
``map`` draws is not reproducible; the shard order by seed and epoch is ``datasets``') and yields it
window by window of ``buffer_size`` samples in a keyed permutation
(`lightning_resumable.core.window_shuffle`). Its state sits in ``datasets``' own state dict: the window,
the samples yielded of it, and each group of shards' state at the window's start.

Imported only when a shuffle buffer is found, so ``datasets`` is installed. One of the two places
that touch ``datasets``' internals (`lightning_resumable.readers.hugging_face`); checked by
``tests/test_datasets_internals.py``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import numpy as np
from datasets import iterable_dataset
from datasets.iterable_dataset import BufferShuffledExamplesIterable, _BaseExamplesIterable

from lightning_resumable.core.window_shuffle import fresh_place, read_shuffled
from lightning_resumable.format._keys import Domain, domain_key

__all__ = ["WindowShuffledExamplesIterable", "replace_buffers"]

_INTERLEAVED: Any = getattr(iterable_dataset, "InterleavedShardsExamplesIterable", ())
"""datasets 5's interleave of a shuffle's input shards (``()``: a release without one reads them in turn)."""


class _Inner:
    """The chain below the shuffle as one `lightning_resumable.core.window_shuffle.SequentialSource`."""

    def __init__(self, chain: Any) -> None:
        self.chain = chain

    def open(self, position: Any) -> Iterator[Any]:
        if position is None:
            self.chain._init_state_dict()
        else:
            self.chain.load_state_dict(copy.deepcopy(position))
        return iter(self.chain)

    def position(self) -> Any:
        return copy.deepcopy(self.chain._state_dict)


class WindowShuffledExamplesIterable(_BaseExamplesIterable):  # type: ignore[misc]  # datasets is untyped
    """``BufferShuffledExamplesIterable``'s place in the chain: the same inner stream, the same
    generator (shifted by epoch and worker as ``datasets`` shifts it), windows instead of a buffer.

    ``interleave``: the shards read side by side (``max_buffer_input_shards``; 1: one after the other).
    ``run_seed`` and ``order_rank`` (the library's; ``None`` where the ranks split one stream by examples after
    the shuffle, as ``datasets`` may: every rank reads it in one order) key the order with the generator;
    ``seed_reads``: the samples read into a window are seeded by their place in it and ``rank`` (a ``map`` before
    the shuffle draws alike when a restore reads the window again, and apart on each rank).
    """

    def __init__(
        self,
        ex_iterable: Any,
        buffer_size: int,
        generator: np.random.Generator,
        interleave: int,
        run_seed: int,
        rank: int,
        seed_reads: bool,
        order_rank: int | None,
    ) -> None:
        super().__init__()
        self.ex_iterable = ex_iterable
        self.buffer_size = buffer_size
        self.generator = generator
        self.interleave = interleave
        self.run_seed, self.rank, self.seed_reads, self.order_rank = run_seed, rank, seed_reads, order_rank

    def _like(self, ex_iterable: Any, generator: np.random.Generator | None = None) -> WindowShuffledExamplesIterable:
        generator = self.generator if generator is None else generator
        return WindowShuffledExamplesIterable(
            ex_iterable,
            self.buffer_size,
            generator,
            self.interleave,
            self.run_seed,
            self.rank,
            self.seed_reads,
            self.order_rank,
        )

    def _groups(self) -> list[Any]:
        """The groups of shards read side by side: contiguous runs of this worker's shards, as ``datasets``
        splits them for its interleave."""
        groups = min(int(self.ex_iterable.num_shards), self.interleave)
        if groups <= 1:
            return [self.ex_iterable]
        return [self.ex_iterable.shard_data_sources(groups, index) for index in range(groups)]

    def shift_rngs(self, value: int) -> WindowShuffledExamplesIterable:
        shifted = int(copy.deepcopy(self.generator).integers(0, 1 << 63)) - value  # as datasets shifts its buffer's
        return self._like(self.ex_iterable, np.random.default_rng(seed=shifted))

    def shuffle_data_sources(self, generator: np.random.Generator) -> WindowShuffledExamplesIterable:
        return self._like(self.ex_iterable.shuffle_data_sources(generator))

    def shard_data_sources(
        self, num_shards: int, index: int, contiguous: bool = True
    ) -> WindowShuffledExamplesIterable:
        return self._like(self.ex_iterable.shard_data_sources(num_shards, index, contiguous=contiguous))

    def reshard_data_sources(self) -> WindowShuffledExamplesIterable:
        return self._like(self.ex_iterable.reshard_data_sources())

    @property
    def num_shards(self) -> int:
        return int(self.ex_iterable.num_shards)

    @property
    def is_typed(self) -> bool:
        return bool(self.ex_iterable.is_typed)

    @property
    def features(self) -> Any:
        return self.ex_iterable.features

    def _init_state_dict(self) -> dict[str, Any]:
        self._sources = [_Inner(group) for group in self._groups()]
        self._state_dict = {**fresh_place(len(self._sources)), "type": type(self).__name__}
        return self._state_dict

    def key(self, rank: int | None) -> int:
        """A key of this pass: the library's seed and ``rank`` (``None``: none), and the generator ``datasets``
        gave the pass."""
        drawn = int(copy.deepcopy(self.generator).integers(0, 1 << 63))
        if rank is None:
            return domain_key(self.run_seed, Domain.WINDOW, drawn)
        return domain_key(self.run_seed, Domain.WINDOW, drawn, rank)

    def __iter__(self) -> Iterator[Any]:
        if self._state_dict is None:
            self._init_state_dict()
        place = self._state_dict
        order, reads = self.key(self.order_rank), self.key(self.rank)
        yield from read_shuffled(self._sources, self.buffer_size, order, place, self.seed_reads, reads)


def replace_buffers(chain: Any, run_seed: int, rank: int, seed_reads: bool, order_rank: int | None) -> Any:
    """``chain`` (an ``IterableDataset``'s ``_ex_iterable``) with each shuffle buffer replaced by windows
    of its size; the nodes on the way are copied, the user's dataset is left as it was. ``order_rank``: the
    rank that keys the windows' order (`WindowShuffledExamplesIterable`)."""
    if isinstance(chain, BufferShuffledExamplesIterable):
        inner, interleave = chain.ex_iterable, 1
        if isinstance(inner, _INTERLEAVED):  # read side by side here, not in threads
            inner, interleave = inner.ex_iterable, inner.max_input_shards
        inner = replace_buffers(inner, run_seed, rank, seed_reads, order_rank)
        return WindowShuffledExamplesIterable(
            inner, chain.buffer_size, chain.generator, interleave, run_seed, rank, seed_reads, order_rank
        )
    if getattr(chain, "ex_iterable", None) is not None:
        copied = copy.copy(chain)
        copied.ex_iterable = replace_buffers(chain.ex_iterable, run_seed, rank, seed_reads, order_rank)
        return copied
    if getattr(chain, "ex_iterables", None):
        copied = copy.copy(chain)
        copied.ex_iterables = [
            replace_buffers(each, run_seed, rank, seed_reads, order_rank) for each in chain.ex_iterables
        ]
        return copied
    return chain
