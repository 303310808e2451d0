"""WebDataset pipelines, taken over: tar shards split, shuffled and read side by side, samples in windows.

Promise: a ``wds.WebDataset(urls, shardshuffle=..., nodesplitter=...)`` (or a ``wds.DataPipeline`` of
``SimpleShardList``, ``split_by_node``, ``split_by_worker``, ``shuffle``, ``tarfile_to_samples``)
with a ``.shuffle(n)`` and any stages before or after it (``.decode``, ``.to_tuple``, ``.map``,
``.batched``), returned in a torch ``DataLoader``, a ``StatefulDataLoader`` or a ``WebLoader``,
resumes exactly. WebDataset keeps no state, so the library reads the shards itself
(`WebShards`): each epoch's shard order is a keyed permutation of the URLs (when the pipeline shuffles
shards), split by rank and by worker as WebDataset's splitters split them; each worker reads its shards
in up to `lightning_resumable.core.window_shuffle.INTERLEAVED_SOURCES` groups side by side and yields
windows of ``n`` samples in a keyed permutation. Its state is the epoch and the place in the pass: per
group of shards the shard, the samples read of it and the byte offset of the next one (a local,
uncompressed tar is opened there; another is read from its start to it). The samples are WebDataset's
own (``__key__``, ``__url__`` and one entry per file suffix); the order is the library's, not the one
WebDataset's buffer would draw.

What is taken over and what is refused, stage by stage: `lightning_resumable.readers.web_plan`.
"""

from __future__ import annotations

import copy
import os
import re
import tarfile
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlparse

import torch
import webdataset as wds
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torchdata.stateful_dataloader import StatefulDataLoader
from webdataset import tariterators
from webdataset.gopen import gopen

from lightning_resumable.core.order import EpochOrder
from lightning_resumable.core.window_shuffle import INTERLEAVED_SOURCES, fresh_place, read_shuffled
from lightning_resumable.errors import UnsupportedLoaderError
from lightning_resumable.format._keys import Domain, domain_key, stream_key
from lightning_resumable.readers import streams
from lightning_resumable.readers.base import BuildOptions, Built
from lightning_resumable.readers.stream_elsewhere import Layout, Made, Opened
from lightning_resumable.readers.web_plan import WebPlan, apply, plan_of, sample_by_sample, stage_name

__all__ = ["WebShards", "build", "mixture_source", "recognises"]


_META = re.compile(r"__[^/]*__($|/)")


class TarShards:
    """A group of shards read one after the other, a `lightning_resumable.core.window_shuffle.SequentialSource`:
    its position is (shard, samples read of it, byte offset of the next sample)."""

    def __init__(self, urls: list[str], plan: WebPlan) -> None:
        self.urls, self.before, self.local_paths = urls, plan.before, plan.local_paths
        self.shard, self.read = 0, 0
        self.offset: int | None = 0

    def position(self) -> Any:
        return (self.shard, self.read, self.offset)

    def open(self, position: Any) -> Iterator[Any]:
        self.shard, self.read, self.offset = (0, 0, 0) if position is None else position
        return apply(self.before, self._samples())

    def _samples(self) -> Iterator[dict[str, Any]]:
        while self.shard < len(self.urls):
            shard = self.shard
            yield from self._shard_samples(self.urls[shard])
            if self.shard == shard:  # its last sample was read before (or it has none)
                self.shard, self.read, self.offset = shard + 1, 0, 0

    def _shard_samples(self, url: str) -> Iterator[dict[str, Any]]:
        """``url``'s samples from ``self.read`` on: a local, uncompressed tar opened at the next sample's byte
        offset, another read from its start with the samples before skipped."""
        path = _local_path(url)
        offset = self.offset if path is not None and not _compressed(url) else None
        with open(path, "rb") if path is not None else gopen(url, "rb") as stream:
            base, skip = 0, self.read
            if offset is not None:
                stream.seek(offset)
                base, skip = offset, 0
            with tarfile.open(fileobj=stream, mode="r|*") as tar:
                sample: dict[str, Any] = {}
                for info in tar:
                    name = info.name
                    meta = "/" not in name and name.startswith("__") and name.endswith("__")
                    prefix, suffix = tariterators.base_plus_ext(name)
                    if not info.isreg() or meta or _META.match(name) or prefix is None:
                        continue
                    if prefix != sample.get("__key__"):
                        if tariterators.valid_sample(sample) and skip:
                            skip -= 1
                        elif tariterators.valid_sample(sample):
                            self.read, self.offset = self.read + 1, base + info.offset
                            yield sample
                        sample = {"__key__": prefix, "__url__": url}
                        if self.local_paths and path is not None:
                            sample["__local_path__"] = path
                    extracted = tar.extractfile(info)
                    assert extracted is not None
                    sample[suffix.lower()] = extracted.read()
                    tar.members = []  # type: ignore[attr-defined]  # a stream's members, kept by tarfile otherwise
                if tariterators.valid_sample(sample) and not skip:
                    self.shard, self.read, self.offset = self.shard + 1, 0, 0  # the shard's last: the next one's start
                    yield sample


def _local_path(url: str) -> str | None:
    parsed = urlparse(url)
    if parsed.scheme in ("", "file") and os.path.isfile(parsed.path or url):
        return parsed.path or url
    return None


def _compressed(url: str) -> bool:
    return url.endswith((".gz", ".tgz", ".bz2", ".xz", ".zst"))


class WebShards(IterableDataset[Any]):
    """A WebDataset pipeline's samples in the library's order, with a state (see the module).

    Args:
        plan: the pipeline's `WebPlan`.
        seed: the run's seed; ``rank`` and ``world_size``: this process's place (derived, never saved).
        seed_reads: seed each sample read into a window by its place (stages before the shuffle draw alike).
    """

    def __init__(self, plan: WebPlan, seed: int, rank: int, world_size: int, seed_reads: bool) -> None:
        if world_size > 1 and not plan.split_by_node:
            raise UnsupportedLoaderError(
                "the WebDataset pipeline has no node splitter, so every process would read every shard: pass"
                " nodesplitter=wds.split_by_node (or add wds.split_by_node to the pipeline)"
            )
        self.plan, self.seed, self.rank, self.world_size, self.seed_reads = plan, seed, rank, world_size, seed_reads
        self.epoch = 0
        self.drop_last = False  # the loader's (set by `build`): its workers' last partial batches are not trained
        self._place: dict[str, Any] = fresh_place(1)
        self._restored: dict[str, Any] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def shards(self, worker: int, workers: int, rank: int | None = None, world_size: int | None = None) -> list[str]:
        """The URLs ``worker`` of ``workers`` reads in this epoch, in order, on this process (or on ``rank`` of
        ``world_size``)."""
        rank = self.rank if rank is None else rank
        world_size = self.world_size if world_size is None else world_size
        urls = list(self.plan.urls)
        if self.plan.shuffle_shards and len(urls) > 1:
            seed = domain_key(self.seed, Domain.WINDOW, len(urls)) >> 1
            urls = [urls[index] for index in EpochOrder(len(urls), seed, self.epoch)(torch.arange(len(urls))).tolist()]
        if self.plan.split_by_node:
            urls = urls[rank::world_size]
        if self.plan.split_by_worker:
            urls = urls[worker::workers]
        return urls

    def _partition(
        self, rank: int, world_size: int, worker: int, workers: int, place: dict[str, Any], samples: bool = False
    ) -> Iterator[Any]:
        """What ``worker`` of ``workers`` on ``rank`` of ``world_size`` yields in this epoch from ``place`` (updated as
        it reads): its shards in groups side by side, in windows keyed by the epoch, the rank and the worker
        (``samples``: before the stages after the shuffle, `made` makes each into its item)."""
        urls = self.shards(worker, workers, rank, world_size)
        shuffled = self.plan.buffer > 1 or self.plan.shuffle_shards  # else its order is kept: one shard at a time
        groups = max(1, min(len(urls), INTERLEAVED_SOURCES if shuffled else 1))
        bounds = [len(urls) * number // groups for number in range(groups + 1)]
        sources = [TarShards(urls[bounds[n] : bounds[n + 1]], self.plan) for n in range(groups)]
        key = domain_key(stream_key(self.seed, self.epoch, rank, worker), Domain.WINDOW)
        read = read_shuffled(sources, self.plan.buffer, key, place, self.seed_reads)
        return read if samples else apply(self.plan.after, read)

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        self._place, self._restored = self._restored or fresh_place(1), None
        return self._partition(self.rank, self.world_size, worker, workers, self._place)

    # ------------------------------------------------------------ `Partitions`: its epoch read on another layout
    def open(self, epoch: int, first: Layout, rank: int, worker: int, place: dict[str, Any] | None) -> Opened:
        """What ``worker`` of ``rank`` of the ``first`` layout reads of ``epoch`` from ``place``, in this process."""
        assert epoch == self.epoch, "the epoch going on is the pass's"
        at = fresh_place(1) if place is None else place  # updated as it reads
        read = self._partition(rank, first.world_size, worker, first.workers, at, samples=self.maker() is not None)
        return read, lambda: copy.deepcopy(at)

    def maker(self) -> Made | None:
        """Stages after the shuffle that make each sample's item apart (map, decode...) run on a worker's own samples
        only: `made` makes one."""
        return self.made if sample_by_sample(self.plan.after) else None

    def made(self, sample: Any) -> tuple[bool, Any]:
        """``(True, item)``: ``sample`` (read by `_partition` with ``samples``) made into its item by the stages after
        the shuffle; ``(False, None)``: they dropped it."""
        for item in apply(self.plan.after, iter([sample])):
            return True, item
        return False, None

    def place_of(self, state: Mapping[str, Any]) -> dict[str, Any] | None:
        return dict(state["place"])

    def refusal(self, state: Mapping[str, Any]) -> str | None:
        if state.get("drop_last", False):
            return (
                "the checkpoint's run read its WebDataset pipeline with drop_last=True: its workers' last partial"
                " batches were not trained, and the epoch's order on another layout is not dealt so"
            )
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "place": copy.deepcopy(self._place), "drop_last": self.drop_last}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if int(state["epoch"]) == self.epoch:  # (another epoch's place: the pass starts afresh)
            self._place = self._restored = copy.deepcopy(dict(state["place"]))


def recognises(loader: object) -> bool:
    """A ``WebLoader``, or a torch ``DataLoader`` or ``StatefulDataLoader`` over a WebDataset pipeline."""
    if isinstance(loader, wds.WebLoader):
        return True
    return type(loader) in (DataLoader, StatefulDataLoader) and isinstance(
        getattr(loader, "dataset", None), wds.DataPipeline
    )


def build(loader: Any, options: BuildOptions) -> Built:
    """``loader`` reading `WebShards` of its pipeline, as a `lightning_resumable.readers.streams.StreamLoader`.

    Raises:
        UnsupportedLoaderError: a ``WebLoader`` with stages of its own, or a pipeline stage not taken over.
    """
    if isinstance(loader, wds.WebLoader):
        if len(loader.pipeline) != 1:
            names = ", ".join(stage_name(stage) for stage in loader.pipeline[1:])
            raise UnsupportedLoaderError(
                f"the WebLoader has stages of its own ({names}): they mix what the workers read in the main"
                " process, an order no state records. Put the shuffle and batching in the dataset's pipeline"
            )
        loader = loader.pipeline[0]
    plan = plan_of(loader.dataset)
    dataset = WebShards(plan, options.seed, options.rank, options.num_replicas, options.seed_samples)
    dataset.drop_last = bool(getattr(loader, "drop_last", False))
    return streams.build(loader, options, subclass=False, dataset=dataset)


def mixture_source(dataset: Any, window: int) -> object:
    """A WebDataset pipeline is a stream, not a source a `lightning_resumable.Mixture` reads by index.

    Raises:
        UnsupportedLoaderError: always.
    """
    raise UnsupportedLoaderError(
        "a WebDataset pipeline is read as a stream; a Mixture reads its sources by index (a map-style dataset)"
    )
