"""LitData's ``StreamingDataset`` read by chunk and index: as a `Mixture` reads it, and as the rest of an epoch
resumed on another layout reads it (`lightning_resumable.readers.litdata_elsewhere`). Imported only where LitData is.

Private LitData API, tested against the version CI installs (``tests/test_litdata_internals.py``): the cache's
reader, its config, download request, item loader and release, as ``BinaryReader.read`` uses them.
"""

from __future__ import annotations

import bisect
import collections
from typing import Any

from litdata import StreamingDataset
from litdata.streaming.item_loader import ParquetLoader, TokensLoader
from litdata.streaming.sampler import ChunkedIndex
from litdata.utilities.env import _WorkerEnv

__all__ = ["LitDataChunkReader"]


class LitDataChunkReader:
    """LitData's ``StreamingDataset`` as a `Mixture` reads it: by an index that names the chunk, each chunk
    fetched once and held while this process reads it.

    LitData's own read treats a change of chunk as the end of the previous one (a file-locked release,
    its memory map closed), which a mixture's window, read in a permuted order, makes at nearly every
    sample (measured: 14 times slower). Here a process holds the last ``2 * window`` chunks it read (a
    window and the next) and releases a chunk as LitData's read does when it falls out, so a bounded
    cache (``max_cache_size``) may delete it. The chunk table is taken in the process that reads, as
    LitData's ``__getitem__`` takes it; the dataset's own ``__getitem__`` (a user's subclass) is called.
    """

    def __init__(self, dataset: StreamingDataset, window: int) -> None:
        self.dataset, self.held = dataset, 2 * window
        self._firsts: list[int] = []
        self._intervals: list[Any] = []

    def __len__(self) -> int:  # all its samples: LitData's len is one rank's share under DDP
        return sum(int(end) - int(start) for start, end in self.dataset.region_of_interest)

    def __getitem__(self, index: int) -> Any:
        if not self._intervals:
            self._start_reading()
        chunk = bisect.bisect_right(self._firsts, index) - 1
        return self.dataset[ChunkedIndex(int(self._intervals[chunk][1]) + index - self._firsts[chunk], chunk)]

    def _start_reading(self) -> None:
        dataset = self.dataset
        if dataset.cache is None:  # as LitData's __getitem__ makes it
            dataset.worker_env = _WorkerEnv.detect()
            dataset.cache = dataset._create_cache(worker_env=dataset.worker_env)
        if not isinstance(dataset.cache, _HeldChunks):
            dataset.cache = _HeldChunks(dataset.cache, self.held)
        self._intervals, first = list(dataset.cache.get_chunk_intervals()), 0
        for interval in self._intervals:
            self._firsts.append(first)
            first += int(interval[2]) - int(interval[1])

    def read(self, chunk: int, index: int) -> Any:
        """The sample of LitData's index ``index`` in chunk ``chunk`` (the index its plan deals)."""
        if not self._intervals:
            self._start_reading()
        return self.dataset[ChunkedIndex(index, chunk)]

    def __getstate__(self) -> dict[str, Any]:  # a worker takes the table in its own process
        return {"dataset": self.dataset, "held": self.held, "_firsts": [], "_intervals": []}


class _HeldChunks:
    """LitData's ``Cache`` whose reads by ``ChunkedIndex`` hold the last ``held`` chunks (private LitData API:
    its reader's config, download request, item loader and release, as ``BinaryReader.read`` uses them)."""

    def __init__(self, cache: Any, held: int) -> None:
        self._cache, self._held, self._open = cache, held, collections.OrderedDict[int, None]()

    def __getattr__(self, name: str) -> Any:
        if name == "_cache":  # not set yet (unpickling, in a worker not forked): don't recurse
            raise AttributeError(name)
        return getattr(self._cache, name)

    def __getitem__(self, index: Any) -> Any:
        if not isinstance(index, ChunkedIndex):
            return self._cache[index]
        reader = self._cache._reader
        if reader._config is None and reader._try_load_config() is None:
            raise RuntimeError(f"LitData's index of {self._cache._cache_dir} cannot be read")
        chunk = index.chunk_index
        if chunk in self._open:
            self._open.move_to_end(chunk)
        else:
            reader.setup_thread_and_download_chunk(index)  # fetched (and counted as in use) if remote
            self._open[chunk] = None
            while len(self._open) > self._held:
                self._release(reader, self._open.popitem(last=False)[0])
        path, begin, size = reader.config[index]
        if reader._pytree_loader:
            return reader._item_loader.load_item_from_chunk(index.index, chunk, path, begin, size, reader._encryption)
        return reader._item_loader.load_item_from_chunk(index.index, chunk, path, begin, size)

    @staticmethod
    def _release(reader: Any, chunk: int) -> None:
        config = reader._config
        if (config._remote_dir or config._compressor) and reader._prepare_thread is not None:
            reader._prepare_thread._decrement_local_lock(chunk)
            reader._held_shared.discard(chunk)
            reader._prepare_thread.delete([chunk])
        if isinstance(reader._item_loader, (TokensLoader, ParquetLoader)):
            reader._item_loader.close(chunk)
