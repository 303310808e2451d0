"""Streams: the loader's state at the trainer's count (not after the look-ahead), per-rank state,
refusals of a stateless stream and of another world size or worker count."""

from __future__ import annotations

import dataclasses
import functools
import gc
import random
import weakref
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from lightning_resumable import (
    IncompatibleStateError,
    ResumableDataCallback,
    ResumableDataModule,
    ResumeVerificationError,
    StateFormatError,
    StreamPositionError,
    UnsupportedLoaderError,
    WorkerCountChangedError,
    WorldSizeChangedError,
)
from lightning_resumable.core.verification import check_first_stream_batches, digest_of
from lightning_resumable.format._keys import stream_key, stream_sample_seed
from lightning_resumable.format.envelope import StreamState
from lightning_resumable.readers.streams import make_stream_resumable

from .helpers import Counting, Model, loader_state, stream_loader, trainer


class Stateless(IterableDataset[int]):
    def __iter__(self) -> Any:
        return iter(range(8))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_state_at_the_trainers_count_survives_a_look_ahead(num_workers: int) -> None:
    """Lightning reads batch k + 1 before a checkpoint after batch k: the state handed out is batch k's."""
    full = [batch.tolist() for batch in stream_loader(num_workers)]
    loader = stream_loader(num_workers)
    batches = iter(loader)
    seen = [next(batches).tolist() for _ in range(4)]  # 3 trained, the 4th read ahead
    restored = stream_loader(num_workers)
    restored.resume_from(loader.state_after(3), batches=3)
    assert seen[:3] + [batch.tolist() for batch in restored] == full
    assert restored.batches_yielded == len(full)


class HandsOutItsLiveState(IterableDataset[torch.Tensor]):
    """A stream whose ``state_dict`` returns the dict it reads on with (as a user's may)."""

    def __init__(self) -> None:
        self.state = {"position": 0}

    def __iter__(self) -> Any:
        while self.state["position"] < 12:
            self.state["position"] += 1
            yield torch.tensor(self.state["position"])

    def state_dict(self) -> dict[str, int]:
        return self.state

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.state = dict(state)


FOR_A_TEST: dict[str, Any] = {
    "seed": 5,
    "rank": 0,
    "world_size": 1,
    "seed_samples": True,
    "restore_globals": True,
    "epoch_source": lambda: 0,
}


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_state_recorded_before_a_batch_stays_that_batchs_when_the_stream_hands_out_its_live_state(
    num_workers: int,
) -> None:
    """The loader's state is recorded before every batch without a copy of torchdata's (a third of the time):
    the stream's own part is still copied, so a stream that hands out its live dict is recorded as it was."""
    loader = make_stream_resumable(
        DataLoader(HandsOutItsLiveState(), batch_size=2, num_workers=num_workers), **FOR_A_TEST
    )
    batches = iter(loader)
    for _ in range(4):  # 3 trained, the 4th read ahead
        next(batches)
    state = loader.state_after(3)
    resumed = make_stream_resumable(
        DataLoader(HandsOutItsLiveState(), batch_size=2, num_workers=num_workers), **FOR_A_TEST
    )
    resumed.resume_from(state, batches=3)
    assert [batch.tolist() for batch in resumed] == [[7, 8], [9, 10], [11, 12]]


def test_a_state_older_than_the_look_ahead_is_refused() -> None:
    loader = stream_loader(0)
    batches = iter(loader)
    for _ in range(6):
        next(batches)
    with pytest.raises(StreamPositionError, match="its state at batch 1 is not known"):
        loader.state_after(1)


def test_lightning_does_not_see_the_stream_loaders_state() -> None:
    """Lightning would save rank 0's state after its look-ahead, and load it on every rank."""
    loader = stream_loader(0)
    assert loader.state_dict is None and loader.load_state_dict is None


def test_sample_seeds_differ_by_rank_worker_epoch_and_count() -> None:
    keys = {stream_key(1, epoch, rank, worker) for epoch in range(3) for rank in range(4) for worker in range(4)}
    assert len(keys) == 3 * 4 * 4
    key = stream_key(1, 0, 0, 0)
    seeds = [stream_sample_seed(key, count) for count in range(1000)]
    assert len(set(seeds)) == 1000 and all(0 <= seed < 2**63 for seed in seeds)


def test_a_stateless_stream_is_refused() -> None:
    with pytest.raises(UnsupportedLoaderError, match="without state_dict/load_state_dict"):
        make_stream_resumable(DataLoader(Stateless()), **FOR_A_TEST)


def test_a_stream_loader_out_of_order_is_refused() -> None:
    """docs/streams-and-loaders.md: ``in_order=False`` hands out batches as workers finish them: no order to resume."""
    user = DataLoader(Counting(), batch_size=2, num_workers=1, in_order=False)
    with pytest.raises(UnsupportedLoaderError, match="in_order=False"):
        make_stream_resumable(user, **FOR_A_TEST)


class EpochStream(IterableDataset[torch.Tensor]):
    """A user's stream whose order changes with its epoch (a plain attribute: each worker's copy has its own),
    split across workers; each sample carries a draw from the global generator."""

    def __init__(self, size: int = 24) -> None:
        self.size, self.epoch, self.position, self._start = size, 0, 0, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Any:
        worker = get_worker_info()
        order = [(index * 7 + self.epoch * 5) % self.size for index in range(self.size)]
        mine = order[worker.id :: worker.num_workers] if worker else order
        self.position, self._start = self._start, 0
        while self.position < len(mine):
            self.position += 1
            yield torch.tensor([float(mine[self.position - 1]), random.random()])

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = self._start = state["position"] if state["epoch"] == self.epoch else 0


def epoch_loader(persistent: bool, cell: list[int]) -> Any:
    user = DataLoader(EpochStream(), batch_size=2, num_workers=2, persistent_workers=persistent)
    return make_stream_resumable(
        user, seed=5, rank=0, world_size=1, seed_samples=True, restore_globals=True, epoch_source=lambda: cell[0]
    )


def epoch_batches(loader: Any, cell: list[int], epochs: range) -> list[list[list[float]]]:
    read = []
    for epoch in epochs:
        cell[0] = epoch
        read.append([batch.tolist() for batch in loader])
    return read


@pytest.mark.parametrize("trained", [3, 1])
def test_persistent_workers_read_each_epoch_and_a_restore_as_workers_started_anew(trained: int) -> None:
    """``persistent_workers=True`` (Lightning's advice for loaders with workers): the workers keep their copies of
    the stream from pass to pass, yet each pass reads the trainer's epoch, and a restore mid-epoch goes on into the
    next epochs as a loader whose workers start each pass anew (ids and what each sample drew). After 1 batch, the
    second worker had not yielded in the epoch: it was saved with the last pass's count, and its samples resumed
    under other seeds."""
    cell = [0]
    expected = epoch_batches(epoch_loader(False, cell), cell, range(3))
    persistent = epoch_loader(True, cell)
    assert epoch_batches(persistent, cell, range(3)) == expected
    cell[0] = 1
    cut = iter(persistent)
    for _ in range(trained + 1):  # the next one read ahead
        next(cut)
    state = persistent.state_after(trained)
    del cut
    persistent.retire_workers()
    resumed = epoch_loader(True, cell)
    resumed.resume_from(state, trained)
    assert [batch.tolist() for batch in resumed] == expected[1][trained:]
    assert epoch_batches(resumed, cell, range(2, 3)) == expected[2:]
    resumed.retire_workers()


@functools.cache
def saved_on(world_size: int, num_workers: int, global_position: bool = False) -> StreamState:
    """A stream state of real loader states, each marked with its rank (an extra key: allowed)."""
    ranks = [{**loader_state(num_workers), "rank state": rank} for rank in range(world_size)]
    return StreamState(1, 0, 3, world_size, num_workers, global_position, False, ranks)


def marks(*states: dict[str, Any]) -> list[int]:
    return [state["rank state"] for state in states]


def test_each_rank_restores_its_own_state() -> None:
    saved = StreamState.from_dict(saved_on(3, 2).to_dict())
    assert marks(*(stream_loader(2).state_for_rank(saved, rank, 3) for rank in range(3))) == [0, 1, 2]


def test_another_world_size_is_refused_for_a_per_rank_stream() -> None:
    with pytest.raises(WorldSizeChangedError, match="written on 2 processes and resumes on 3"):
        stream_loader(2).state_for_rank(saved_on(2, 2), 0, 3)


def test_another_worker_count_is_refused() -> None:
    with pytest.raises(WorkerCountChangedError, match="num_workers=2 per process and resumes with num_workers=0"):
        stream_loader(0).state_for_rank(saved_on(2, 2), 0, 2)


def test_a_global_position_restores_rank_zeros_state_on_any_world_size() -> None:
    saved = saved_on(2, 0, global_position=True)
    assert marks(*(stream_loader(0).state_for_rank(saved, rank, 3) for rank in range(3))) == [0, 0, 0]


def test_a_state_from_a_newer_torchdata_is_refused_and_an_older_ones_read() -> None:
    written = dataclasses.replace(saved_on(1, 0), torchdata="0.11.0")
    refused = r"written with torchdata 0\.11\.0 and resumes with torchdata 0\.10\.0"
    with pytest.raises(IncompatibleStateError, match=refused):
        stream_loader(0).state_for_rank(written, 0, 1, torchdata="0.10.0")
    reader = stream_loader(0)
    assert marks(
        reader.state_for_rank(written, 0, 1, torchdata="0.11.2"),
        reader.state_for_rank(written, 0, 1, torchdata="0.12.0.dev1"),
    ) == [0, 0]
    assert marks(reader.state_for_rank(saved_on(1, 0), 0, 1, torchdata="0.10.0")) == [0]  # not recorded: not checked


def test_a_version_1_stream_state_reads_without_a_torchdata_version() -> None:
    raw = {key: value for key, value in saved_on(2, 0).to_dict().items() if key != "torchdata"}
    state = StreamState.from_dict({**raw, "version": 1})
    assert (state.torchdata, state.next_batch, state.batch_size, state.next_samples, state.version) == (
        "",
        None,
        None,
        None,
        5,
    )
    four = StreamState.from_dict({**saved_on(2, 0).to_dict(), "version": 4})  # before samples' digests
    assert (four.next_samples, four.version) == (None, 5)
    with pytest.raises(StateFormatError, match="must be str"):
        StreamState.from_dict({**saved_on(2, 0).to_dict(), "torchdata": 11})


def test_the_mixin_refuses_a_stateless_stream_before_training(tmp_path: Path) -> None:
    class Data(ResumableDataModule, L.LightningDataModule):
        def train_dataloader(self) -> DataLoader[Any]:
            return DataLoader(Stateless())

    with pytest.raises(UnsupportedLoaderError, match="Stateless"):
        trainer(tmp_path, [ResumableDataCallback()], max_steps=1).fit(Model(), Data())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"version": 9}, r"reads \(1, 2, 3, 4, 5\)"),
        ({"next_samples": [["0" * 16]]}, "one list of 16-digit hex digests per rank"),
        ({"next_samples": [["0" * 16], ["X" * 16]]}, "one list of 16-digit hex digests per rank"),
        ({"next_samples": [[], "0" * 16]}, "one list of 16-digit hex digests per rank"),
        ({"next_samples": "0" * 16}, "'next_samples' must be list"),
        ({"batch_size": 0}, "no rank"),
        ({"batch_size": "4"}, "'batch_size' must be int"),
        ({"next_batch": ["0" * 16]}, "one 16-digit hex digest"),
        ({"next_batch": ["0" * 16, "X" * 16]}, "one 16-digit hex digest"),
        ({"next_batch": "0" * 16}, "'next_batch' must be list"),
        ({"epoch": "1"}, "'epoch' must be int"),
        ({"finished": 1}, "'finished' must be bool"),
        ({"ranks": [{}]}, "one loader state per rank"),
        ({"reader": "Not a tag!"}, "must be a reader's tag"),
        ({"reader": ""}, "must be a reader's tag"),
    ],
)
def test_a_malformed_stream_state_is_refused(change: dict[str, Any], message: str) -> None:
    with pytest.raises(StateFormatError, match=message):
        StreamState.from_dict({**saved_on(2, 0).to_dict(), **change})


def test_a_version_2_stream_state_reads_without_next_batch_digests() -> None:
    """0.2.x recorded no digest of each rank's next batch: such a resume is not verified."""
    raw = {key: value for key, value in saved_on(2, 0).to_dict().items() if key != "next_batch"}
    assert StreamState.from_dict({**raw, "version": 2}).next_batch is None
    with pytest.raises(StateFormatError, match="missing keys"):
        StreamState.from_dict({**raw, "version": 3})


def test_a_version_3_stream_state_reads_without_a_batch_size() -> None:
    """0.3.0 recorded no batch size: another one is then not refused before the first batch (its digest differs)."""
    raw = {key: value for key, value in saved_on(2, 0).to_dict().items() if key != "batch_size"}
    assert StreamState.from_dict({**raw, "version": 3}).batch_size is None
    with pytest.raises(StateFormatError, match="missing keys"):
        StreamState.from_dict({**raw, "version": 4})


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_read_ahead_batch_is_digested_and_the_first_restored_batch_compared(num_workers: int) -> None:
    """A stream's batch cannot be fetched again from a state: the batch Lightning read ahead at the save
    is digested, and the first batch read after the restore is digested for the comparison."""
    loader = stream_loader(num_workers)
    batches = iter(loader)
    seen = [next(batches) for _ in range(4)]  # 3 trained, the 4th read ahead
    assert loader.next_batch_digest(3) == digest_of(seen[3])
    assert loader.next_batch_digest(5) == ""  # not read yet: nothing to record
    restored = stream_loader(num_workers)
    restored.resume_from(loader.state_after(3), batches=3, next_batch=loader.next_batch_digest(3))
    assert restored.first_batch is None
    next(iter(restored))
    assert restored.first_batch == (digest_of(seen[3]), digest_of(seen[3]))
    elsewhere = stream_loader(num_workers)
    elsewhere.resume_from(loader.state_after(2), batches=3, next_batch=loader.next_batch_digest(3))  # one batch early
    next(iter(elsewhere))
    assert elsewhere.first_batch == (digest_of(seen[3]), digest_of(seen[2]))


def test_first_stream_batches_that_differ_are_refused_naming_each_rank() -> None:
    check_first_stream_batches([("a" * 16, "a" * 16), None], epoch=1, batches=3)  # rank 1 recorded nothing
    with pytest.raises(ResumeVerificationError, match="after 3 batches") as refused:
        check_first_stream_batches([("a" * 16, "a" * 16), ("b" * 16, "c" * 16), ("d" * 16, "e" * 16)], 1, 3)
    assert "rank 0" not in str(refused.value)
    assert f"rank 1 read a batch with digest {'c' * 16}, not {'b' * 16}; rank 2 read" in str(refused.value)


def test_a_stream_loader_and_its_unexhausted_pass_are_freed_without_the_garbage_collector() -> None:
    # Its pass record holds the loader weakly: no cycle keeps the iterator to the collector, which closed its
    # queues before the workers were told to end (5 s each). A pass being read keeps its loader alive.
    collecting = gc.isenabled()
    gc.disable()
    try:
        loader = stream_loader(2)
        batches = iter(loader)
        next(batches)
        freed = weakref.ref(loader)
        del loader
        assert freed() is not None, "the pass being read keeps its loader"
        next(batches)
        del batches
        assert freed() is None, "the loader is in a reference cycle"
    finally:
        if collecting:
            gc.enable()
