"""LitData's order of an epoch on a layout, computed from its own plan: the first step of resuming LitData's loader
on another world size, number of workers or batch size (issue 55; docs/development.md).

Promise: `planned_batches` gives the batches one rank of a layout reads in an epoch, in the order LitData's loader
hands them out, without reading a sample: LitData's plan deals chunk intervals to the layout's workers
(``get_chunks_and_intervals_per_workers``), each worker reads its intervals in turn, each shuffled by LitData's
shuffler (keyed by the epoch and the chunk), in batches of the loader's size (the last one partial), and torch's
loader hands out the workers' batches in turn, passing over one that has run out (what
``tests/test_torch_internals.py`` checks of torch). So the interrupted epoch of any layout can be read on another.

Private LitData API, checked against the version CI installs (``tests/test_litdata_internals.py``: the plan equals
LitData's own loader, 0 to 3 workers, batches of 4 and 5): ``_create_cache``, ``_create_shuffler``, the shuffler's
``get_chunks_and_intervals_per_workers`` and ``__call__``, the cache's ``get_chunk_intervals``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from litdata.utilities.env import _DistributedEnv, _WorkerEnv

__all__ = ["planned_batches"]


def planned_batches(
    dataset: Any, *, world_size: int, rank: int, num_workers: int, batch_size: int, epoch: int, num_nodes: int = 1
) -> list[list[tuple[int, int]]]:
    """The batches rank ``rank`` of ``world_size`` (on ``num_nodes`` nodes) reads of LitData's ``epoch`` (LitData
    counts from 1) with ``num_workers`` workers and batches of ``batch_size``: each a list of (chunk, sample index)
    pairs."""
    workers = max(num_workers, 1)
    cache = dataset._create_cache(worker_env=_WorkerEnv(world_size=workers, rank=0))
    shuffler = dataset._create_shuffler(cache)
    place = _DistributedEnv(world_size=world_size, global_rank=rank, num_nodes=num_nodes)
    chunks, intervals = shuffler.get_chunks_and_intervals_per_workers(place, workers, batch_size, epoch)
    chunk_count = len(cache.get_chunk_intervals())
    per_worker: list[list[list[tuple[int, int]]]] = []
    for worker in range(rank * workers, (rank + 1) * workers):
        samples: list[tuple[int, int]] = []
        for chunk, interval in zip(chunks[worker], intervals[worker], strict=True):
            indices = shuffler(np.arange(interval[1], interval[2]), chunk_count, epoch, chunk)
            samples.extend((int(chunk), int(index)) for index in indices)
        per_worker.append([samples[start : start + batch_size] for start in range(0, len(samples), batch_size)])
    # The workers' batches in turn; one that has run out is passed over.
    batches: list[list[tuple[int, int]]] = []
    for turn in range(max(map(len, per_worker), default=0)):
        batches.extend(worker[turn] for worker in per_worker if turn < len(worker))
    return batches
