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

from lightning_resumable.core.window_shuffle import fresh_place, is_fresh, read_shuffled, shuffled_windows
from lightning_resumable.errors import IncompatibleStateError
from lightning_resumable.format._keys import Domain, domain_key

__all__ = ["WindowShuffledExamplesIterable", "read_as_saved", "replace_buffers"]

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


class _ArrowInner:
    """The chain below the shuffle read as Arrow tables, a row at a time (a sample is ``(table, row)``): its position
    is the chain's state before the current table and the rows taken of it (``datasets``' Arrow states count whole
    tables, and re-yield a table a restore should enter)."""

    def __init__(self, chain: Any) -> None:
        self.chain = chain
        self._before: Any = None
        self._taken = 0

    def open(self, position: Any) -> Iterator[tuple[Any, int]]:
        if position is None:
            self.chain._init_state_dict()
            self._before, self._taken = None, 0
        else:
            self.chain.load_state_dict(copy.deepcopy(position["table"]))
            self._before, self._taken = position["table"], int(position["rows"])
        return self._rows(self._taken)

    def _rows(self, skip: int) -> Iterator[tuple[Any, int]]:
        tables = self.chain.iter_arrow()
        while True:
            before = self.chain.state_dict()
            try:
                _, table = next(tables)
            except StopIteration:
                return
            self._before, self._taken = before, skip
            for row in range(skip, len(table)):
                self._taken = row + 1  # before the yield: the position after the rows handed out
                yield table, row
            skip = 0

    def position(self) -> Any:
        if self._before is None:
            return None
        return {"table": copy.deepcopy(self._before), "rows": self._taken}


class _Mode:
    """Whether one stream's windows may be read as Arrow tables: shared by every copy ``datasets`` makes of them (per
    epoch, rank and worker); `read_as_saved` sets it at a restore to the way the checkpoint's run read them."""

    def __init__(self, arrow: bool) -> None:
        self.arrow = arrow


_PURE = frozenset(
    {
        "ArrowExamplesIterable",
        "RebatchedArrowExamplesIterable",
        "ShuffledDataSourcesArrowExamplesIterable",
        "SkipExamplesIterable",
        "TakeExamplesIterable",
        "StepExamplesIterable",
        "SelectColumnsIterable",
    }
)
"""The nodes of a chain that draw nothing and keep rows whole: a chain of these and one shuffle is read as Arrow
(a ``map`` or ``filter`` read as Arrow runs on whole tables, whose draws the windows could not seed per sample)."""


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
        mode: _Mode | None = None,
    ) -> None:
        super().__init__()
        self.ex_iterable = ex_iterable
        self.buffer_size = buffer_size
        self.generator = generator
        self.interleave = interleave
        self.run_seed, self.rank, self.seed_reads, self.order_rank = run_seed, rank, seed_reads, order_rank
        self.mode = _Mode(False) if mode is None else mode

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
            self.mode,
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

    @property
    def iter_arrow(self) -> Any:
        """Read as Arrow tables where the stream's mode allows it and the chain below reads so."""
        return self._iter_arrow if self.mode.arrow and self.ex_iterable.iter_arrow else None

    def _init_state_dict(self) -> dict[str, Any]:
        groups = len(self._groups())
        # "arrow": how the place's positions were read (None: not yet; a place of 0.3 has no such key)
        self._state_dict = {**fresh_place(groups), "arrow": None, "type": type(self).__name__}
        return self._state_dict

    def _place(self, arrow: bool) -> dict[str, Any]:
        """The pass's place, which this pass reads as Arrow or example by example: a place read the other way is
        refused (its positions would be misread)."""
        if self._state_dict is None:
            self._init_state_dict()
        place: dict[str, Any] = self._state_dict
        read = place.get("arrow")
        if read is not None and read != arrow and not is_fresh(place):
            saved, now = ("Arrow tables", "example by example") if read else ("example by example", "Arrow tables")
            raise IncompatibleStateError(
                f"the Hugging Face stream's shuffle was saved reading its shards as {saved}, and this pass reads them"
                f" {now}: the stream's pipeline differs from the saved run's (a map, filter or format added or"
                " removed). Resume with the saved pipeline"
            )
        place["arrow"] = arrow
        return place

    def key(self, rank: int | None) -> int:
        """A key of this pass: the library's seed and ``rank`` (``None``: none), and the generator ``datasets``
        gave the pass."""
        drawn = int(copy.deepcopy(self.generator).integers(0, 1 << 63))
        if rank is None:
            return domain_key(self.run_seed, Domain.WINDOW, drawn)
        return domain_key(self.run_seed, Domain.WINDOW, drawn, rank)

    def __iter__(self) -> Iterator[Any]:
        place = self._place(arrow=False)
        sources = [_Inner(group) for group in self._groups()]
        order, reads = self.key(self.order_rank), self.key(self.rank)
        yield from read_shuffled(sources, self.buffer_size, order, place, self.seed_reads, reads)

    def _iter_arrow(self) -> Iterator[tuple[str, Any]]:
        """Each window as one table, its rows in the window's order; the place is the one after the window as it is
        handed out (the ``RebatchedArrowExamplesIterable`` above keeps the place before it, and the rows taken)."""
        import pyarrow as pa  # type: ignore[import-untyped]  # datasets' own dependency

        place = self._place(arrow=True)
        sources = [_ArrowInner(group) for group in self._groups()]
        order = self.key(self.order_rank)
        for ordered, skip, after in shuffled_windows(sources, self.buffer_size, order, place, seed_reads=False):
            place.update(after)
            rows = ordered[skip:]
            if rows:
                tables: dict[int, tuple[int, Any]] = {}  # id -> (its first row in the concatenation, the table)
                for table, _ in rows:
                    if id(table) not in tables:
                        tables[id(table)] = (sum(len(each) for _, each in tables.values()), table)
                indices = [tables[id(table)][0] + row for table, row in rows]
                window = pa.concat_tables([table for _, table in tables.values()])
                yield f"window{int(after['window']) - 1}", window.take(indices)


def read_as_saved(dataset: Any, state: Any) -> None:
    """Before ``dataset``'s ``load_state_dict(state)``: its windows offer Arrow tables as the checkpoint's run's did.
    ``datasets`` puts a ``RebatchedArrowExamplesIterable`` above a chain that offers them, which has a state of its
    own, and reads the windows' positions within tables; a checkpoint of 0.3 (positions of examples, no mark of how
    they were read) is read example by example again."""
    saved = [node for node in _dicts(state) if node.get("type") == WindowShuffledExamplesIterable.__name__]
    if not saved:
        return
    top = state.get("examples_iterable") if isinstance(state, dict) else None
    rebatched = isinstance(top, dict) and top.get("type") == "RebatchedArrowExamplesIterable"
    of_0_3 = any(place.get("arrow") is None and not is_fresh(place) for place in saved)
    for node in _nodes(dataset._ex_iterable):
        if isinstance(node, WindowShuffledExamplesIterable):
            node.mode.arrow = rebatched and not of_0_3 and _pure(dataset._ex_iterable, node)


def _dicts(state: Any) -> Iterator[dict[str, Any]]:
    if isinstance(state, dict):
        yield state
        for value in state.values():
            yield from _dicts(value)
    elif isinstance(state, (list, tuple)):
        for value in state:
            yield from _dicts(value)


def _nodes(chain: Any) -> Iterator[Any]:
    pending = [chain]
    while pending:
        node = pending.pop()
        if node is None:
            continue
        yield node
        pending.append(getattr(node, "ex_iterable", None))
        pending.extend(getattr(node, "ex_iterables", None) or [])


def _pure(chain: Any, windows: Any) -> bool:
    """Whether every node of ``chain`` but ``windows`` (the one shuffle) draws nothing and keeps rows whole."""
    return all(node is windows or type(node).__name__ in _PURE for node in _nodes(chain))


def replace_buffers(chain: Any, run_seed: int, rank: int, seed_reads: bool, order_rank: int | None) -> Any:
    """``chain`` (an ``IterableDataset``'s ``_ex_iterable``) with each shuffle buffer replaced by windows
    of its size; the nodes on the way are copied, the user's dataset is left as it was. ``order_rank``: the
    rank that keys the windows' order (`WindowShuffledExamplesIterable`). Windows over a chain of `_PURE` nodes
    alone are read as Arrow tables."""
    replaced = _replaced(chain, run_seed, rank, seed_reads, order_rank)
    for node in _nodes(replaced):
        if isinstance(node, WindowShuffledExamplesIterable):
            node.mode.arrow = _pure(replaced, node)
    return replaced


def _replaced(chain: Any, run_seed: int, rank: int, seed_reads: bool, order_rank: int | None) -> Any:
    if isinstance(chain, BufferShuffledExamplesIterable):
        inner, interleave = chain.ex_iterable, 1
        if isinstance(inner, _INTERLEAVED):  # read side by side here, not in threads
            inner, interleave = inner.ex_iterable, inner.max_input_shards
        inner = _replaced(inner, run_seed, rank, seed_reads, order_rank)
        return WindowShuffledExamplesIterable(
            inner, chain.buffer_size, chain.generator, interleave, run_seed, rank, seed_reads, order_rank
        )
    if getattr(chain, "ex_iterable", None) is not None:
        copied = copy.copy(chain)
        copied.ex_iterable = _replaced(chain.ex_iterable, run_seed, rank, seed_reads, order_rank)
        return copied
    if getattr(chain, "ex_iterables", None):
        copied = copy.copy(chain)
        copied.ex_iterables = [_replaced(each, run_seed, rank, seed_reads, order_rank) for each in chain.ex_iterables]
        return copied
    return chain
