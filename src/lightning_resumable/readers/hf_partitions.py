"""A Hugging Face stream's first-layout workers' streams, opened in any process: its epoch resumed on another world
size, number of workers or batch size (issue 55; `lightning_resumable.readers.stream_elsewhere`).

Promise: `HfPartitions.open` reads what worker ``w`` of rank ``r`` of the layout that began the epoch read, from its
saved state, in a worker of any other layout: the user's stream split as ``split_dataset_by_node`` split it for
``r`` (`split_as`), its shuffle buffers taken over by windows keyed by ``r`` as that rank's were, the worker's state
loaded as ``datasets`` loads it, and read while torch's ``get_worker_info()`` answers as worker ``w`` would
(`lightning_resumable.internals._torch.read_as_worker`): ``datasets`` deals its shards to the worker it runs in, and
shifts its generators by that worker's number. Tested against the first layout's own loaders
(``tests/test_stream_elsewhere.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning_resumable.internals._torch import read_as_worker
from lightning_resumable.readers.hugging_face import read_as_saved, split_as, take_over_buffers
from lightning_resumable.readers.stream_elsewhere import Layout, Made, Opened

__all__ = ["HfPartitions", "hf_partitions"]


class HfPartitions:
    """`lightning_resumable.readers.stream_elsewhere.Partitions` of the user's ``datasets.IterableDataset`` (as the
    loader was given it: split for this rank, its buffers not yet taken over)."""

    def __init__(self, dataset: Any, seed: int, seed_reads: bool) -> None:
        self.dataset, self.seed, self.seed_reads = dataset, seed, seed_reads

    def open(self, epoch: int, first: Layout, rank: int, worker: int, place: dict[str, Any] | None) -> Opened:
        split = split_as(self.dataset, rank, first.world_size)
        taken = take_over_buffers(split, self.seed, rank, self.seed_reads)
        stream = split if taken is None else taken
        stream.set_epoch(epoch)
        if place is not None:
            read_as_saved(stream, place)
            stream.load_state_dict(place)
        items = read_as_worker(iter(stream), worker if first.num_workers else None, first.num_workers, stream)
        return items, stream.state_dict

    def maker(self) -> Made | None:
        return None  # the chain's stages run where its shards are read

    def place_of(self, state: Mapping[str, Any]) -> dict[str, Any] | None:
        return dict(state)

    def refusal(self, state: Mapping[str, Any]) -> str | None:
        return None


def hf_partitions(dataset: object, seed: int, seed_reads: bool) -> HfPartitions | None:
    """``dataset``'s partitions if it is a Hugging Face stream, else ``None``."""
    if type(dataset).__module__.split(".")[0] != "datasets" or not hasattr(dataset, "_ex_iterable"):
        return None
    return HfPartitions(dataset, seed, seed_reads)
