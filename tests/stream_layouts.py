"""What the tests of a stream read on several layouts share (`tests/test_stream_elsewhere.py`,
`tests/test_stream_order.py`): 8 shards of 5 samples as WebDataset pipelines and Hugging Face streams of several
forms, each sample drawing from the global generators, and the global sequence of a layout's ranks. The WebDataset
forms need webdataset (CI's extras step): `write_shards` skips without it."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest
import torch

try:
    import webdataset as wds
except ImportError:  # the Hugging Face forms run without it
    wds = None

SHARDS, PER_SHARD = 8, 5


def write_shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    if wds is None:
        pytest.skip("webdataset is not installed (CI's extras step runs these)")
    directory = tmp_path_factory.mktemp("shards")
    with wds.ShardWriter(str(directory / "shard-%02d.tar"), maxcount=PER_SHARD, verbose=0) as sink:
        for sample_id in range(SHARDS * PER_SHARD):
            sink.write({"__key__": f"sample{sample_id:04d}", "txt": str(sample_id)})
    return sorted(str(path) for path in directory.glob("shard-*.tar"))


def drawn(sample: dict[str, Any]) -> tuple[int, float]:
    return int(sample["txt"]), float(torch.rand(())) + random.random() + float(np.random.rand())


def drawn_before(sample: dict[str, Any]) -> tuple[int, float]:
    return drawn(sample)


PIPELINES = {
    "drawn after the shuffle": lambda urls: (
        wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.split_by_node, seed=3)
        .shuffle(4)
        .decode()
        .map(drawn)
    ),
    "drawn before it": lambda urls: wds.DataPipeline(
        wds.SimpleShardList(urls),
        wds.split_by_node,
        wds.split_by_worker,
        wds.tarfile_to_samples(),
        wds.decode(),
        wds.map(drawn_before),  # the windows seed each sample they read
        wds.shuffle(3),
    ),
}

PIPELINES["batched after the shuffle"] = lambda urls: PIPELINES["drawn after the shuffle"](urls).batched(
    3, collation_fn=None
)
"""Batched in the pipeline (the loader's ``batch_size=None``): its items are batches of 3, made with the samples'
draws in the partitions (the stages after the shuffle are not made sample by sample)."""


def dropping(sample: dict[str, Any]) -> tuple[int, float] | None:
    return None if int(sample["txt"]) == 37 else drawn(sample)


PIPELINES["dropping a sample"] = lambda urls: (
    wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.split_by_node, seed=3)
    .shuffle(4)
    .decode()
    .map(dropping)
)

Layout = tuple[int, int, int]  # processes, workers, batch size (ignored for a pipeline batched in itself)


def hf_rows(shards: list[int], first: int = 0) -> Any:
    for shard in shards:
        for row in range(PER_SHARD):
            yield {"txt": str(first + shard * PER_SHARD + row)}


def hf_stream(strategy: str, rank: int, world: int) -> Any:
    """8 shards of a generator's rows, drawn in ``map``, shuffled through a buffer of 4, split by node with
    ``strategy`` (``datasets``' ``auto`` splits by examples where the shards do not divide among the ranks)."""
    from datasets import IterableDataset as HFIterableDataset
    from datasets.distributed import split_dataset_by_node

    rows = HFIterableDataset.from_generator(hf_rows, gen_kwargs={"shards": list(range(SHARDS))})
    shuffled = rows.map(drawn_row).shuffle(seed=7, buffer_size=4)
    return split_dataset_by_node(shuffled, rank=rank, world_size=world, strategy=strategy)


def drawn_row(row: dict[str, Any]) -> dict[str, Any]:
    sample_id, value = drawn(row)
    return {"id": sample_id, "value": value}


def hf_arrow_stream(rank: int, world: int) -> Any:
    """A ``Dataset``'s rows read as Arrow tables (the library's windows read so): shuffled, torch-formatted."""
    from datasets import Dataset
    from datasets.distributed import split_dataset_by_node

    rows = Dataset.from_dict({"id": list(range(SHARDS * PER_SHARD))}).to_iterable_dataset(num_shards=SHARDS)
    return split_dataset_by_node(rows.shuffle(seed=7, buffer_size=4).with_format("torch"), rank=rank, world_size=world)


def ids_of_rows(rows: list[dict[str, Any]]) -> list[int]:
    return [int(row["id"]) for row in rows]


def hf_interleaved(rank: int, world: int) -> Any:
    """Two shuffled streams of 8 shards each interleaved at random (``interleave_datasets``), drawn in ``map`` after
    it, split by node."""
    import datasets
    from datasets import IterableDataset as HFIterableDataset
    from datasets.distributed import split_dataset_by_node

    sources = [
        HFIterableDataset.from_generator(hf_rows, gen_kwargs={"shards": list(range(SHARDS)), "first": first}).shuffle(
            seed, buffer_size=3
        )
        for seed, first in ((3, 0), (4, 100))
    ]
    mixed = datasets.interleave_datasets(sources, probabilities=[0.3, 0.7], seed=9).map(drawn_row)
    return split_dataset_by_node(mixed, rank=rank, world_size=world)


STREAMS = {
    "hugging face interleaved": hf_interleaved,
    "hugging face": lambda rank, world: hf_stream("auto", rank, world),
    "hugging face split by examples": lambda rank, world: hf_stream("examples", rank, world),
    "hugging face as arrow": hf_arrow_stream,
}


def global_sequence(ranks: list[list[list[Any]]]) -> list[Any]:
    """The samples of the ranks' batches step after step, rank after rank in a step."""
    return [
        sample
        for step in range(max(map(len, ranks)))
        for batches in ranks
        if step < len(batches)
        for sample in batches[step]
    ]


def sample_id(sample: Any) -> int:
    return int(sample["id"] if isinstance(sample, dict) else sample if isinstance(sample, int) else sample[0])


def assert_goes_on(before: list[Any], after: list[Any], full: list[Any], global_batch: int) -> None:
    """``after`` is ``full`` from ``before``'s end on, its last uneven global batch padded with its own items."""
    rest = full[len(before) :]
    assert before == full[: len(before)]
    assert after[: len(rest)] == rest
    own = len(rest) % global_batch or global_batch
    padding = math.ceil(len(rest) / global_batch) * global_batch - len(rest)
    assert after[len(rest) :] == (rest[len(rest) - own :] * global_batch)[:padding]
