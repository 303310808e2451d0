"""`lightning_resumable.readers.litdata` against the installed LitData (CI's extras step; skipped without it):
the state at the trainer's count survives Lightning's look-ahead, a restore is not overwritten before
its pass begins, and a resumed pass that Lightning stops at its length, without exhausting it, is not
replayed as the next epoch."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from lightning_resumable.errors import UnsupportedLoaderError, WorldSizeChangedError
from lightning_resumable.format.envelope import StreamState
from lightning_resumable.readers.streams import state_for_rank

from .e2e import train

litdata = pytest.importorskip("litdata")

from lightning_resumable.readers.litdata import LitDataLoader, make_litdata_resumable  # noqa: E402

BATCHES = 12  # 48 samples in batches of 4, one process


@pytest.fixture(scope="module")
def chunks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("litdata") / "chunks"
    train.write_litdata(directory, 48)
    return directory


def loader(chunks: Path, num_workers: int, epoch: list[int]) -> LitDataLoader:
    context = {"multiprocessing_context": "fork"} if num_workers else {}  # litdata.optimize sets spawn
    user = litdata.StreamingDataLoader(train.litdata_stream(chunks), batch_size=4, num_workers=num_workers, **context)
    return make_litdata_resumable(user, seed=3, epoch_source=lambda: epoch[0])


def pass_of(batches: Any, count: int = BATCHES) -> list[list[Any]]:
    """``count`` batches of a pass, as ids and augmentations; the pass is left unexhausted, as
    Lightning leaves a sized loader's."""
    return [[batch[0].tolist(), batch[1].tolist()] for batch in itertools.islice(batches, count)]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_resume_at_the_trainers_count_continues_the_epoch_and_the_next_one_is_fresh(
    chunks: Path, num_workers: int
) -> None:
    epoch = [0]
    full = loader(chunks, num_workers, epoch)
    expected = []
    for epoch[0] in range(3):
        expected.append(pass_of(iter(full)))
    stopped = loader(chunks, num_workers, epoch)
    epoch[0] = 0
    pass_of(iter(stopped))
    epoch[0] = 1
    batches = iter(stopped)
    seen = pass_of(batches, 4)  # 3 trained, the 4th read ahead by Lightning
    state = stopped.state_after(3)
    digest = stopped.next_batch_digest(3)
    resumed = loader(chunks, num_workers, epoch)
    resumed.resume_from(state, 3, digest)
    assert resumed.state_after(3) == state  # before the pass: the restored state, not LitData's own
    assert seen[:3] + pass_of(iter(resumed), BATCHES - 3) == expected[1]
    assert resumed.first_batch == (digest, digest)
    epoch[0] = 2
    assert pass_of(iter(resumed)) == expected[2]  # the resumed pass was never exhausted


def test_another_layout_is_refused_for_litdata_until_it_is_resumed_elastically() -> None:
    saved = StreamState(1, 0, 3, 2, 2, False, False, [{}, {}], reader="litdata")
    with pytest.raises(WorldSizeChangedError, match="does not resume LitData elastically yet"):
        state_for_rank(saved, 0, 1, 2)
    with pytest.raises(WorldSizeChangedError, match="num_workers=2 and resumes on 2 with num_workers=0"):
        state_for_rank(saved, 0, 2, 0)
    assert state_for_rank(saved, 1, 2, 2) == {}  # LitData's state: torchdata's structure is not checked


def test_a_seeded_dataset_pickles_for_a_spawned_worker_as_the_users_class_seeded_again(chunks: Path) -> None:
    import pickle

    dataset = litdata.StreamingDataset(str(chunks))
    make_litdata_resumable(litdata.StreamingDataLoader(dataset, batch_size=4), seed=3, epoch_source=lambda: 0)
    copied = pickle.loads(pickle.dumps(dataset))
    assert type(copied).__mro__[1] is litdata.StreamingDataset  # the user's class, seeded again:
    assert {"__getitem__", "__reduce__"} <= set(vars(type(copied)))


def test_a_combined_dataset_is_resumed_without_workers_and_refused_with_them(chunks: Path) -> None:
    """LitData sums a combined dataset's counts over the workers, and its resume then reads other samples
    (tests/e2e/test_litdata.py resumes one exactly without workers)."""
    combined = litdata.CombinedStreamingDataset([train.litdata_stream(chunks), train.litdata_stream(chunks)], seed=5)
    made = make_litdata_resumable(litdata.StreamingDataLoader(combined, batch_size=4), seed=3, epoch_source=lambda: 0)
    assert isinstance(made, LitDataLoader)
    with_workers = litdata.StreamingDataLoader(combined, batch_size=4, num_workers=2)
    with pytest.raises(UnsupportedLoaderError, match="CombinedStreamingDataset with num_workers > 0"):
        make_litdata_resumable(with_workers, seed=3, epoch_source=lambda: 0)
