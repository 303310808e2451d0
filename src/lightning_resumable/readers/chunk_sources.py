"""A `Mixture`'s source as the mixture reads it by index.

Promise: LitData's ``StreamingDataset`` is read through an index that names the chunk
(``ChunkedIndex``), so a read does not scan LitData's chunk table (a linear scan per sample); any other
source is read as it is. LitData is imported only where a source is LitData's (its adapter module).
"""

from __future__ import annotations

import bisect
import importlib
from typing import Any

from lightning_resumable.core.chunks import Chunked
from lightning_resumable.internals._chunk_tables import is_of

__all__ = ["LitDataChunkReader", "readable"]


class LitDataChunkReader:
    """LitData's ``StreamingDataset`` read by index through a ``ChunkedIndex`` (no scan of the chunk table).

    The chunk table is LitData's own (``cache.get_chunk_intervals()``), taken in the process that reads,
    as LitData's ``__getitem__`` takes it."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self._firsts: list[int] = []
        self._intervals: list[Any] = []

    def __len__(self) -> int:  # all its samples: LitData's len is one rank's share under DDP
        return sum(int(end) - int(start) for start, end in self.dataset.region_of_interest)

    def __getitem__(self, index: int) -> Any:
        if not self._intervals:
            self._intervals = importlib.import_module("lightning_resumable.readers.litdata").chunk_intervals(
                self.dataset
            )
            first = 0
            for interval in self._intervals:
                self._firsts.append(first)
                first += int(interval[2]) - int(interval[1])
        chunk = bisect.bisect_right(self._firsts, index) - 1
        interval = self._intervals[chunk]
        return self.dataset[self._chunked_index(int(interval[1]) + index - self._firsts[chunk], chunk)]

    @staticmethod
    def _chunked_index(index: int, chunk: int) -> Any:
        return importlib.import_module("lightning_resumable.readers.litdata").ChunkedIndex(index, chunk)

    def __getstate__(self) -> dict[str, Any]:  # a worker takes the table in its own process
        return {"dataset": self.dataset, "_firsts": [], "_intervals": []}


def readable(source: object) -> object:
    """``source`` as a mixture reads it by index: LitData's through `LitDataChunkReader`, any other as it is."""
    inner = source.dataset if isinstance(source, Chunked) else source
    if is_of(inner, "litdata", "StreamingDataset"):
        return LitDataChunkReader(inner)
    return source
