"""The Hugging Face ``datasets`` internals `lightning_resumable.readers.hugging_face` reads, against the installed
version, and a stream shuffled through a buffer, resumed exactly by windows (issue 46)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_resumable.readers.build import make_resumable
from lightning_resumable.readers.hugging_face import shuffle_buffer_size

from .helpers import assert_restores_twice_exactly

datasets = pytest.importorskip("datasets")
from datasets.distributed import split_dataset_by_node  # noqa: E402


def stream() -> Any:
    def rows() -> Any:
        for row in range(16):
            yield {"id": row}

    return datasets.IterableDataset.from_generator(rows).map(lambda example: example)


def sharded(shards: int, first: int = 0) -> Any:
    """A stream of ``shards`` shards of 4 rows, ids from ``first``."""

    def rows(shards: list[int]) -> Any:
        for shard in shards:
            for row in range(4):
                yield {"id": first + shard * 4 + row}

    return datasets.IterableDataset.from_generator(rows, gen_kwargs={"shards": list(range(shards))})


def test_the_shuffle_buffer_is_found_through_maps_and_the_split_by_node() -> None:
    from datasets.distributed import split_dataset_by_node

    assert shuffle_buffer_size(stream()) is None
    shuffled = split_dataset_by_node(stream().shuffle(seed=1, buffer_size=16).map(lambda e: e), rank=0, world_size=2)
    assert shuffle_buffer_size(shuffled) == 16
    assert shuffle_buffer_size(stream().shuffle(seed=1, buffer_size=1)) == 1
    assert shuffle_buffer_size([1, 2]) is None, "not a datasets object"


def seeded_loader(dataset: Any, epoch: int, workers: int = 0) -> Any:
    """The library's stream loader over ``dataset`` (its buffer taken over) in ``epoch``."""
    loader = DataLoader(dataset, batch_size=3, num_workers=workers, collate_fn=list)
    return make_resumable(loader, seed=5, num_replicas=1, rank=0, epoch_source=lambda: epoch)


def drawing(example: dict[str, Any]) -> dict[str, Any]:
    """An augmenting map: what it draws from the global generators is part of the sample."""
    return {"id": example["id"], "x": float(torch.rand(())) + random.random() + float(np.random.rand())}


def arrow_rows(rows: int, shards: int) -> Any:
    """A stream read as Arrow tables (``Dataset.to_iterable_dataset``): an id and a float a row."""
    return datasets.Dataset.from_dict(
        {"id": list(range(rows)), "x": [row / 7 for row in range(rows)]}
    ).to_iterable_dataset(num_shards=shards)


SHUFFLED = {
    "map-before": lambda: sharded(16).map(drawing).shuffle(seed=1, buffer_size=5),
    "map-after-split": lambda: split_dataset_by_node(
        sharded(16).shuffle(seed=1, buffer_size=5), rank=1, world_size=2
    ).map(drawing),
    "split-before": lambda: (
        split_dataset_by_node(sharded(16), rank=0, world_size=2).shuffle(seed=6, buffer_size=6).map(drawing)
    ),
    "filter": lambda: sharded(16).filter(lambda e: e["id"] % 3 != 0).shuffle(seed=2, buffer_size=4).map(drawing),
    "to-iterable": lambda: (
        datasets.Dataset.from_dict({"id": list(range(60))})
        .to_iterable_dataset(num_shards=6)
        .shuffle(seed=5, buffer_size=7)
        .map(drawing)
    ),
    "arrow": lambda: arrow_rows(60, shards=6).shuffle(seed=5, buffer_size=7),
    "arrow-split": lambda: split_dataset_by_node(
        arrow_rows(60, shards=6).shuffle(seed=5, buffer_size=7), rank=1, world_size=2
    ),
    "arrow-split-by-examples": lambda: split_dataset_by_node(
        arrow_rows(60, shards=3).shuffle(seed=5, buffer_size=7), rank=1, world_size=2
    ),
    "interleaved": lambda: datasets.interleave_datasets(
        [sharded(8).shuffle(seed=3, buffer_size=4), sharded(8, first=100).shuffle(seed=4, buffer_size=3)],
        probabilities=[0.3, 0.7],
        seed=9,
    ).map(drawing),
}


@pytest.mark.parametrize("name", list(SHUFFLED))
def test_a_shuffled_stream_resumes_exactly_after_any_batch(name: str) -> None:
    """Ids and what the maps drew, after a restore at each batch of two epochs; the user's dataset keeps its
    buffer; the state holds no sample (its size does not grow with the samples)."""
    dataset = SHUFFLED[name]()
    for epoch in (0, 1):
        full = list(seeded_loader(dataset, epoch))
        assert len({row["id"] for batch in full for row in batch}) == sum(len(batch) for batch in full)
        for cut in range(1, len(full)):
            state = assert_restores_twice_exactly(lambda epoch=epoch: seeded_loader(dataset, epoch), full, cut)
            assert "'x'" not in repr(state)
    assert shuffle_buffer_size(dataset) is not None, "the user's dataset is left as it was"


def test_the_order_differs_by_epoch_and_from_the_unshuffled_stream() -> None:
    dataset = sharded(16).shuffle(seed=1, buffer_size=5)
    ids = [[row["id"] for batch in seeded_loader(dataset, epoch) for row in batch] for epoch in (0, 1)]
    assert ids[0] != ids[1] and sorted(ids[0]) == sorted(ids[1]) == list(range(64))
    assert ids[0] != sorted(ids[0])


@pytest.mark.parametrize("workers", [2, 3])
def test_workers_resume_exactly_twice_in_a_row(workers: int) -> None:
    """With 3 workers over 8 shards, one reads 2 shards side by side, two read one; a worker that has not read
    yet when the state is taken restores the pass's start (found by the matrix's seed 288). A restored run
    saved again after one more batch, before its other workers' batches were taken: those keep the state
    they were restored with (datasets reports its state before the load until it reads; soak seed 44860491)."""
    dataset = split_dataset_by_node(sharded(16).shuffle(seed=1, buffer_size=5), rank=0, world_size=2).map(drawing)
    full = list(seeded_loader(dataset, 1, workers=workers))
    for cut in (1, 2, 4, len(full) - 2):
        assert_restores_twice_exactly(lambda: seeded_loader(dataset, 1, workers=workers), full, cut)


@pytest.mark.parametrize(
    ("shards", "world_size", "strategy", "workers"),
    [(3, 2, "auto", 0), (3, 2, "auto", 2), (8, 3, "auto", 2), (8, 2, "examples", 0), (8, 2, "auto", 2)],
)
def test_the_ranks_of_a_stream_split_after_its_shuffle_read_every_sample_once(
    shards: int, world_size: int, strategy: str, workers: int
) -> None:
    """``split_dataset_by_node`` of a shuffled stream whose shards the ranks cannot share out (or with
    ``strategy="examples"``) keeps every ``world_size``-th example of one order: every rank must read the same
    windows. Keyed by rank, the windows gave each rank another order, and the ranks trained some samples twice
    and others never (3 shards on 2 ranks: 15 of 18 distinct; soak seed 559296308 under datasets 5.0.1, whose
    shuffle reads its shards as one source: 37 of 48)."""
    options = {} if strategy == "auto" else {"strategy": strategy}
    read: list[int] = []
    for rank in range(world_size):
        split = split_dataset_by_node(
            sharded(shards).shuffle(seed=1, buffer_size=5), rank=rank, world_size=world_size, **options
        ).map(drawing)
        loader = DataLoader(split, batch_size=3, num_workers=workers, collate_fn=list)
        made = make_resumable(loader, seed=5, num_replicas=world_size, rank=rank, epoch_source=lambda: 1)
        read += [row["id"] for batch in made for row in batch]
    assert sorted(read) == list(range(4 * shards))


def _windows_read_as_arrow(loader: Any) -> bool:
    from lightning_resumable.readers.hf_windows import WindowShuffledExamplesIterable

    chain = loader.dataset.dataset._ex_iterable
    while not isinstance(chain, WindowShuffledExamplesIterable):
        chain = chain.ex_iterable
    return bool(chain.mode.arrow)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stream_of_arrow_tables_is_read_as_arrow_in_the_order_read_example_by_example(workers: int) -> None:
    """A shuffled stream whose chain reads Arrow tables and draws nothing is read as Arrow (as ``datasets`` reads its
    own buffer; example by example, its torch format made 64 tensors a row: 0.24x of ``datasets``' speed), in the
    very order and with the very values of the same windows read example by example, with and without a torch
    format; a map anywhere in the chain keeps it example by example."""
    dataset = arrow_rows(60, shards=6).shuffle(seed=5, buffer_size=7)
    for formatted in (dataset, dataset.with_format("torch")):
        as_arrow = seeded_loader(formatted, 1, workers)
        assert _windows_read_as_arrow(as_arrow)
        by_example = seeded_loader(formatted, 1, workers)
        by_example.dataset.dataset._ex_iterable.mode.arrow = False
        read = [[_plain(row) for row in batch] for batch in as_arrow]
        assert read == [[_plain(row) for row in batch] for batch in by_example]
        assert sorted(row["id"] for batch in read for row in batch) == list(range(60))
        assert {type(row["x"]) for batch in as_arrow for row in batch} == (
            {float} if formatted is dataset else {torch.Tensor}
        )
    assert not _windows_read_as_arrow(seeded_loader(dataset.map(drawing), 1))
    assert not _windows_read_as_arrow(
        seeded_loader(arrow_rows(60, shards=6).map(drawing).shuffle(seed=5, buffer_size=7), 1)
    )


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    return {key: value.item() if isinstance(value, torch.Tensor) else value for key, value in row.items()}


@pytest.mark.parametrize("cut", [1, 4, 9])
def test_a_checkpoint_read_example_by_example_resumes_so_where_the_stream_reads_arrow_now(cut: int) -> None:
    """A checkpoint of 0.3 (its windows read example by example, its state without the Arrow wrapper ``datasets``
    puts above a chain read as Arrow) resumes exactly under a version that reads the same stream as Arrow: its
    pass is read as it was saved."""
    dataset = arrow_rows(60, shards=6).shuffle(seed=5, buffer_size=7).with_format("torch")

    def saved_by_0_3() -> Any:
        loader = seeded_loader(dataset, 1)
        loader.dataset.dataset._ex_iterable.mode.arrow = False
        return loader

    full = [[_plain(row) for row in batch] for batch in saved_by_0_3()]
    stopped = saved_by_0_3()
    reading = iter(stopped)
    head = [[_plain(row) for row in next(reading)] for _ in range(cut)]
    state = stopped.state_after(cut)
    del reading
    for place in _places(state):
        place.pop("arrow")  # as 0.3 wrote it
    resumed = seeded_loader(dataset, 1)
    resumed.resume_from(state, cut)
    assert head + [[_plain(row) for row in batch] for batch in resumed] == full
    assert not _windows_read_as_arrow(resumed)


def _places(state: Any) -> list[dict[str, Any]]:
    if isinstance(state, dict):
        found = [state] if state.get("type") == "WindowShuffledExamplesIterable" else []
        return found + [place for value in state.values() for place in _places(value)]
    if isinstance(state, (list, tuple)):
        return [place for value in state for place in _places(value)]
    return []


def test_a_copy_split_as_another_rank_reads_that_ranks_share_and_leaves_the_stream_as_it_was() -> None:
    """`split_as` (a Hugging Face stream resumed on another layout reads another rank's share): ``_distributed``,
    the split ``split_dataset_by_node`` records, is a dataclass of the rank and the world size, read as the stream
    iterates, with either strategy."""
    from lightning_resumable.readers.hugging_face import split_as

    for strategy, shards in (("shards", 8), ("examples", 3)):
        rows = datasets.Dataset.from_dict({"id": list(range(24))}).to_iterable_dataset(num_shards=shards)
        mine = split_dataset_by_node(rows, rank=0, world_size=1, strategy=strategy)
        for rank in range(2):
            theirs = [row["id"] for row in split_dataset_by_node(rows, rank=rank, world_size=2, strategy=strategy)]
            assert [row["id"] for row in split_as(mine, rank, 2)] == theirs
        assert [row["id"] for row in mine] == list(range(24)), "the stream split as another is left as it was"
