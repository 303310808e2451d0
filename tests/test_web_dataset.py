"""WebDataset pipelines taken over (`lightning_resumable.readers.web_dataset`): the samples are WebDataset's,
every shard's sample once per epoch, a restore after any batch continues exactly (0, 2 and 3 workers,
a restore of a restore), other epochs read other orders, and what cannot be taken over is refused."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_resumable import UnsupportedLoaderError
from lightning_resumable.readers.build import make_resumable

from .helpers import assert_restores_twice_exactly

wds = pytest.importorskip("webdataset")

SHARDS, PER_SHARD = 8, 6


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """8 tar shards of 6 samples (an id and a payload), written with WebDataset's ShardWriter."""
    directory = tmp_path_factory.mktemp("shards")
    with wds.ShardWriter(str(directory / "shard-%02d.tar"), maxcount=PER_SHARD, verbose=0) as sink:
        for sample_id in range(SHARDS * PER_SHARD):
            sink.write({"__key__": f"sample{sample_id:04d}", "txt": str(sample_id), "bin": bytes([sample_id]) * 300})
    return sorted(str(path) for path in directory.glob("shard-*.tar"))


def augmented(sample: dict[str, Any]) -> tuple[int, float]:
    return int(sample["txt"]), float(torch.rand(())) + random.random() + float(np.random.rand())


PIPELINES = {
    "fluid": lambda urls, buffer: (
        wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.split_by_node, seed=3)
        .shuffle(buffer)
        .decode()
        .map(augmented)
    ),
    "pipeline": lambda urls, buffer: wds.DataPipeline(
        wds.SimpleShardList(urls),
        wds.split_by_node,
        wds.split_by_worker,
        wds.tarfile_to_samples(),
        wds.decode(),
        wds.map(augmented),  # drawn before the shuffle: the windows seed each sample they read
        wds.shuffle(buffer),
    ),
}


def loader_of(dataset: Any, epoch: int, workers: int = 0, rank: int = 0, world: int = 1) -> Any:
    loader = DataLoader(dataset, batch_size=4, num_workers=workers, collate_fn=list)
    return make_resumable(loader, seed=5, num_replicas=world, rank=rank, epoch_source=lambda: epoch)


def ids(batches: list[list[tuple[int, float]]]) -> list[int]:
    return [sample[0] for batch in batches for sample in batch]


def test_the_samples_are_webdatasets_own(urls: list[str]) -> None:
    from lightning_resumable.readers.web_dataset import WebShards
    from lightning_resumable.readers.web_plan import plan_of

    for own in (
        wds.WebDataset(urls, shardshuffle=False),
        wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples()),
    ):
        assert list(WebShards(plan_of(own), seed=0, rank=0, world_size=1, seed_reads=False)) == list(own)


@pytest.mark.parametrize("form", list(PIPELINES))
def test_every_sample_once_in_a_new_order_each_epoch(urls: list[str], form: str) -> None:
    dataset = PIPELINES[form](urls, 5)
    epochs = [ids(list(loader_of(dataset, epoch))) for epoch in (0, 1)]
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(SHARDS * PER_SHARD))
    assert epochs[0] != epochs[1]
    ranks = [ids(list(loader_of(dataset, 0, rank=rank, world=2))) for rank in (0, 1)]
    assert sorted(ranks[0] + ranks[1]) == list(range(SHARDS * PER_SHARD)), "the ranks split the shards"


@pytest.mark.parametrize(("form", "workers"), [("fluid", 0), ("fluid", 2), ("pipeline", 3)])
def test_a_restore_after_any_batch_and_a_restore_of_a_restore_are_exact(
    urls: list[str], form: str, workers: int
) -> None:
    dataset = PIPELINES[form](urls, 5)
    full = list(loader_of(dataset, 1, workers))
    for cut in range(1, len(full)):
        assert_restores_twice_exactly(lambda: loader_of(dataset, 1, workers), full, cut)


def test_what_cannot_be_taken_over_is_refused(urls: list[str]) -> None:
    with pytest.raises(UnsupportedLoaderError, match="no node splitter"):
        loader_of(wds.WebDataset(urls, shardshuffle=False), 0, world=2)
    with pytest.raises(UnsupportedLoaderError, match="shuffles its samples twice"):
        loader_of(wds.WebDataset(urls, shardshuffle=False).shuffle(4).shuffle(4), 0)
    with pytest.raises(UnsupportedLoaderError, match="repeats or cuts its epoch"):
        loader_of(wds.WebDataset(urls, shardshuffle=False).shuffle(4).with_epoch(10), 0)
    with pytest.raises(UnsupportedLoaderError, match="resampled shards"):
        loader_of(wds.WebDataset(urls, resampled=True).shuffle(4), 0)
    web_loader = wds.WebLoader(wds.WebDataset(urls, shardshuffle=False), batch_size=None).shuffle(10)
    with pytest.raises(UnsupportedLoaderError, match="WebLoader has stages of its own"):
        make_resumable(web_loader, seed=5, num_replicas=1, rank=0)


def test_a_web_loader_without_stages_is_taken_over(urls: list[str]) -> None:
    dataset = wds.WebDataset(urls, shardshuffle=len(urls)).shuffle(5).decode().map(augmented).batched(4)
    made = make_resumable(wds.WebLoader(dataset, batch_size=None), seed=5, num_replicas=1, rank=0)
    batches = list(made)
    assert sorted(i for batch in batches for i in batch[0]) == list(range(SHARDS * PER_SHARD))


def labelled(sample: dict[str, Any]) -> tuple[str, bytes, tuple[int, float]]:
    """A sample WebDataset's default collation batches into plain lists (comparable), its augmentation drawn."""
    return sample["txt"], sample["bin"], augmented(sample)


BATCHED = {
    # Issue 53: webdataset 1.0.2's batched reads the sample after a full batch before yielding it.
    "batched-after": lambda urls: wds.DataPipeline(
        wds.SimpleShardList(urls),
        wds.split_by_node,
        wds.split_by_worker,
        wds.tarfile_to_samples(),
        wds.shuffle(8),
        wds.decode(),
        wds.map(labelled),
        wds.batched(4),
    ),
    "batched-before": lambda urls: (
        wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.split_by_node, seed=3)
        .decode()
        .to_tuple("txt", "bin")
        .batched(3, partial=False)
        .shuffle(4)
    ),
}


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("form", sorted(BATCHED))
def test_a_batched_pipeline_restores_after_any_batch_exactly(urls: list[str], form: str, workers: int) -> None:
    """``.batched`` before or after the shuffle, batched by the pipeline (``batch_size=None``): the restore starts at
    the batch after the saved one, not one sample late."""
    dataset = BATCHED[form](urls)

    def made() -> Any:
        loader = DataLoader(dataset, batch_size=None, num_workers=workers)
        return make_resumable(loader, seed=5, num_replicas=1, rank=0, epoch_source=lambda: 1)

    full = list(made())
    assert len(full) > 4
    for cut in range(1, len(full)):
        assert_restores_twice_exactly(made, full, cut)


def test_a_batched_pipeline_yields_webdatasets_batches(urls: list[str]) -> None:
    """The batches are WebDataset's own (its collation, a partial last one or none), in the same order."""
    from lightning_resumable.readers.web_dataset import WebShards
    from lightning_resumable.readers.web_plan import plan_of

    for partial in (True, False):
        own = wds.DataPipeline(
            wds.SimpleShardList(urls),
            wds.tarfile_to_samples(),
            wds.decode(),
            wds.to_tuple("txt", "bin"),
            wds.batched(5, partial=partial),
        )
        taken = list(WebShards(plan_of(own), seed=0, rank=0, world_size=1, seed_reads=False))
        assert taken == list(own) and len(taken) == (SHARDS * PER_SHARD) // 5 + partial


def test_a_cache_and_unbatched_are_refused_naming_the_stage(urls: list[str], tmp_path: Any) -> None:
    """Issue 53: ``cache_dir`` (WebDataset's FileCache) was read past, the user's cache left empty."""
    cached = wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.split_by_node, cache_dir=str(tmp_path))
    with pytest.raises(UnsupportedLoaderError, match="cache_dir"):
        loader_of(cached.shuffle(4), 0)
    with pytest.raises(UnsupportedLoaderError, match="unbatched"):
        loader_of(wds.WebDataset(urls, shardshuffle=False).batched(4).shuffle(4).unbatched(), 0)
    with pytest.raises(UnsupportedLoaderError, match=r"\.batched\(0\) makes no batch"):
        loader_of(wds.WebDataset(urls, shardshuffle=False).shuffle(4).batched(0), 0)
