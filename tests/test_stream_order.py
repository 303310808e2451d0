"""A stream that declares the layout of its order (``resumable_stream_order``, issue 55: one order per seed and epoch
whatever the layout): every epoch begun on another layout is read in the declared layout's global order, dealt to the
reading layout's ranks and workers (`lightning_resumable.readers.elsewhere_plan.fresh_plan`), and a save inside such
an epoch resumes on any layout, the declared one included. Judged against the declared layout's real loaders, without
Lightning (the end-to-end runs are in tests/e2e). The WebDataset cases need webdataset (CI's extras step)."""

from __future__ import annotations

from typing import Any

import pytest
from torch.utils.data import DataLoader, IterableDataset

from lightning_resumable import UnsupportedLoaderError
from lightning_resumable.format.stream_state import STREAM_ORDER_ATTRIBUTE, StreamState
from lightning_resumable.readers.build import make_resumable
from lightning_resumable.readers.stream_elsewhere import STREAM_ELSEWHERE
from tests.stream_layouts import (
    PIPELINES,
    STREAMS,
    Layout,
    assert_goes_on,
    global_sequence,
    ids_of_rows,
    write_shards,
)

SEED = 5


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """8 shards of 5 samples (`tests.stream_layouts.write_shards`)."""
    return write_shards(tmp_path_factory)


def ordered(
    urls: list[str], form: str, rank: int, layout: Layout, order: Layout | None, epoch: list[int], persistent: bool
) -> Any:
    """Rank ``rank`` of ``layout`` reading ``form``, its stream declaring ``order`` (``None``: none), at the epoch in
    the cell ``epoch``."""
    world, workers, batch = layout
    if form in STREAMS:
        dataset, collate = STREAMS[form](rank, world), (ids_of_rows if "arrow" in form else list)
    else:
        dataset, collate = PIPELINES[form](urls), list
    batch_size = None if form.startswith("batched") else batch
    if order is not None:
        setattr(dataset, STREAM_ORDER_ATTRIBUTE, order if batch_size is not None else (*order[:2], None))
    kept = persistent and workers > 0
    plain = DataLoader(dataset, batch_size=batch_size, num_workers=workers, collate_fn=collate, persistent_workers=kept)
    return make_resumable(plain, seed=SEED, num_replicas=world, rank=rank, epoch_source=lambda: epoch[0])


def epochs_read(urls: list[str], form: str, layout: Layout, order: Layout | None, epochs: range) -> list[list[Any]]:
    """The global sequence of each epoch of ``epochs`` read by ``layout``'s ranks, each rank's loader kept from epoch
    to epoch (persistent workers)."""
    read: list[list[list[list[Any]]]] = [[] for _ in epochs]
    for rank in range(layout[0]):
        cell = [epochs[0]]
        each = ordered(urls, form, rank, layout, order, cell, persistent=True)
        for index, epoch in enumerate(epochs):
            cell[0] = epoch
            read[index].append(list(each))
    return [global_sequence(ranks) for ranks in read]


ORDERED = [
    ("hugging face", (2, 2, 4), (1, 3, 2)),
    ("hugging face", (1, 0, 4), (2, 1, 3)),
    ("hugging face split by examples", (2, 1, 3), (4, 1, 2)),
    ("hugging face as arrow", (2, 2, 4), (1, 0, 6)),
    ("hugging face interleaved", (2, 2, 4), (1, 2, 4)),
    ("drawn after the shuffle", (2, 2, 4), (1, 0, 4)),
    ("drawn after the shuffle", (1, 3, 3), (2, 2, 5)),
    ("drawn before it", (2, 0, 2), (1, 3, 4)),
    ("batched after the shuffle", (2, 2, 1), (1, 3, 1)),
]


@pytest.mark.parametrize(("form", "order", "layout"), ORDERED)
def test_every_epoch_begun_on_another_layout_is_read_in_the_declared_layouts_order(
    request: pytest.FixtureRequest, form: str, order: Layout, layout: Layout
) -> None:
    """Two epochs on a layout other than the declared one, with persistent workers: each is the declared layout's
    global sequence of that epoch (ids and what ``map`` drew), its last uneven global batch padded with its own
    items; without the declaration they are the layout's own order (not the declared one's)."""
    files = [] if form in STREAMS else request.getfixturevalue("urls")
    full = epochs_read(files, form, order, None, range(1, 3))
    assert full[0] != full[1], "the epochs differ (else the test could not tell one from the other)"
    read = epochs_read(files, form, layout, order, range(1, 3))
    for epoch, want in zip(read, full, strict=True):
        assert_goes_on([], epoch, want, layout[0] * layout[2])
    own = epochs_read(files, form, layout, None, range(1, 2))
    assert own[0][: len(full[0])] != full[0]
    assert epochs_read(files, form, order, order, range(1, 2)) == full[:1], "on the declared layout: its own order"


def stopped(
    urls: list[str], form: str, layout: Layout, order: Layout, batches: int, saved: StreamState | None = None
) -> tuple[list[Any], StreamState]:
    """``layout``'s ranks (resumed from ``saved``, if given) read to ``batches`` batches of epoch 1 (one more read
    ahead, as Lightning reads) and are saved there: the global sequence they trained, and the state."""
    read, states = [], []
    first = 0 if saved is None else saved.batches
    for rank in range(layout[0]):
        each = ordered(urls, form, rank, layout, order, [1], persistent=False)
        if saved is not None:
            each.resume_from(each.state_for_rank(saved, rank, layout[0]), saved.batches)
        reading = iter(each)
        read.append([batch for _, batch in zip(range(first, batches + 1), reading, strict=False)][: batches - first])
        states.append(each.state_after(batches))
        del reading
    state = StreamState(SEED, 1, batches, layout[0], layout[1], False, False, states, batch_size=layout[2])
    return global_sequence(read), state


def resumed(urls: list[str], form: str, layout: Layout, order: Layout, saved: StreamState) -> list[Any]:
    ranks = []
    for rank in range(layout[0]):
        each = ordered(urls, form, rank, layout, order, [1], persistent=False)
        each.resume_from(each.state_for_rank(saved, rank, layout[0]), saved.batches)
        ranks.append(list(each))
    return global_sequence(ranks)


def test_a_save_inside_an_epoch_read_in_the_declared_order_resumes_on_any_layout(urls: list[str]) -> None:
    """Saved inside an epoch that a layout reads in the declared order: resumed on the declared layout, on a third
    and on the saving one, the rest of the epoch is the declared layout's; saved before its first batch, the resumed
    pass reads the whole epoch in that order (not as a pass restored at its start, in the layout's own)."""
    form, order, layout = "drawn after the shuffle", (2, 2, 4), (1, 3, 3)
    full = epochs_read(urls, form, order, None, range(1, 2))[0]
    before, saved = stopped(urls, form, layout, order, 4)
    assert STREAM_ELSEWHERE in saved.ranks[0]["_snapshot"]["_worker_snapshots"]["worker_0"]["dataset_state"]["stream"]
    for other in (order, (2, 0, 2), layout):
        assert_goes_on(before, resumed(urls, form, other, order, saved), full, other[0] * other[2])
    _, at_start = stopped(urls, form, layout, order, 0)
    assert_goes_on([], resumed(urls, form, layout, order, at_start), full, layout[0] * layout[2])


def test_a_save_on_the_declared_layout_resumes_elsewhere_in_its_order(urls: list[str]) -> None:
    form, order, layout = "drawn after the shuffle", (2, 2, 4), (1, 0, 5)
    full = epochs_read(urls, form, order, None, range(1, 2))[0]
    before, saved = stopped(urls, form, order, order, 3)
    assert_goes_on(before, resumed(urls, form, layout, order, saved), full, layout[2])


class OwnStream(IterableDataset[int]):
    def __iter__(self) -> Any:
        return iter(range(8))

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


@pytest.mark.parametrize(
    ("declared", "batch_size", "drop_last", "message"),
    [
        ((2, 2), 4, False, r"give \(world_size, num_workers, batch_size\)"),
        ((0, 2, 4), 4, False, r"give \(world_size, num_workers, batch_size\)"),
        ((2, 2, "4"), 4, False, r"give \(world_size, num_workers, batch_size\)"),
        ((2, 2, None), 4, False, "batch_size=None and its loader batch_size=4"),
        ((2, 2, 4), None, False, "batch_size=4 and its loader batch_size=None"),
        ((2, 2, 4), 4, True, "drop_last=True"),
    ],
)
def test_a_declared_order_that_cannot_be_read_is_refused_saying_why(
    urls: list[str], declared: Any, batch_size: int | None, drop_last: bool, message: str
) -> None:
    pipeline = PIPELINES["drawn after the shuffle"](urls)
    setattr(pipeline, STREAM_ORDER_ATTRIBUTE, declared)
    plain = DataLoader(pipeline, batch_size=batch_size, num_workers=1, drop_last=drop_last)
    with pytest.raises(UnsupportedLoaderError, match=message):
        make_resumable(plain, seed=SEED, num_replicas=1, rank=0)


def test_a_stream_of_your_own_cannot_declare_an_order() -> None:
    stream = OwnStream()
    setattr(stream, STREAM_ORDER_ATTRIBUTE, (2, 2, 4))
    with pytest.raises(UnsupportedLoaderError, match="OwnStream's state is its own"):
        make_resumable(DataLoader(stream, batch_size=4), seed=SEED, num_replicas=1, rank=0)
