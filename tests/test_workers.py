"""Loaders the library builds retire their previous iterator (workers and feeder threads ended)
before forking new workers, and warn once on a CPython with the after-fork deadlock."""

from __future__ import annotations

import gc
import pickle
import threading
import time
import warnings
import weakref
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_resumable.core.produced import ProducedBatches, watch_loader
from lightning_resumable.readers import quiet_fork, workers
from lightning_resumable.readers.workers import WorkerSafeDataLoader, worker_safe


def data() -> TensorDataset:
    return TensorDataset(torch.arange(32).float())


def parts_of(iterator: Any) -> tuple[list[Any], list[threading.Thread]]:
    """The iterator's worker processes and its index queues' feeder threads."""
    feeders = [queue._thread for queue in iterator._index_queues if queue._thread is not None]
    return list(iterator._workers), feeders


class Tagged(DataLoader[Any]):
    pass


@pytest.mark.parametrize(
    "build",
    [
        lambda: WorkerSafeDataLoader(data(), batch_size=4, num_workers=2),
        lambda: worker_safe(Tagged(data(), batch_size=4, num_workers=2)),
    ],
)
def test_a_new_pass_retires_the_previous_one_before_forking(build: Any) -> None:
    loader = build()
    for stop_after in (None, 2):  # an exhausted pass, and one abandoned mid-way
        first = iter(loader)
        for index, _ in enumerate(first):
            if index == stop_after:
                break
        processes, feeders = parts_of(first)
        assert processes and feeders
        second = iter(loader)
        assert not [process for process in processes if process.is_alive()]
        assert not [thread for thread in feeders if thread.is_alive()], "feeder threads joined before the fork"
        assert len(list(second)) == 8
    assert type(loader) in (WorkerSafeDataLoader, Tagged), "a user's class stays its own"


def test_the_warning_on_an_affected_python_comes_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "_warned", False)
    monkeypatch.setattr(quiet_fork, "FORK_DEADLOCK_FIXED_IN", (99, 0, 0))
    loader = WorkerSafeDataLoader(data(), batch_size=4, num_workers=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            list(loader)
    assert len([w for w in caught if "gh-112275" in str(w.message)]) == 1
    monkeypatch.setattr(workers, "_warned", False)
    monkeypatch.setattr(quiet_fork, "FORK_DEADLOCK_FIXED_IN", (3, 0, 0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        list(loader)
    assert not [w for w in caught if "gh-112275" in str(w.message)]


def test_before_a_loader_forks_the_threads_of_another_loaders_ended_pass_are_joined(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A CombinedLoader ends a short loader's pass while the long one goes on: its feeder threads end on
    their own, and the next fork of any loader met one ending (a CI hang in the child's after-fork cleanup)."""
    retired: list[object] = []
    retire = workers.retire
    monkeypatch.setattr(workers, "retire", lambda iterator: (retired.append(iterator), retire(iterator)))
    data = TensorDataset(torch.arange(8))
    short, long = (WorkerSafeDataLoader(data, batch_size=4, num_workers=1) for _ in range(2))
    short_pass = iter(short)
    list(short_pass)  # ran out: torch shut its workers down, its queues' threads are left to end
    assert short_pass._shutdown  # type: ignore[attr-defined]
    long_pass = iter(long)
    assert short_pass in retired, "joined before the other loader forked"
    assert all(not queue._thread.is_alive() for queue in short_pass._index_queues if queue._thread)  # type: ignore[attr-defined]
    workers.retire_previous(long)
    del long_pass


def _watched(loader: DataLoader[Any]) -> DataLoader[Any]:
    watch_loader(loader, ProducedBatches(lambda: (0, 0, 0)))
    return loader


@pytest.mark.parametrize("wrap", [_watched, worker_safe, lambda loader: worker_safe(_watched(loader))])
@pytest.mark.parametrize("persistent", [False, True])
def test_a_loader_the_library_wraps_frees_its_workers_at_once_when_dropped(wrap: Any, persistent: bool) -> None:
    # No reference cycle through the iterator factory: the loader and an unexhausted iterator are freed by their
    # reference counts, the iterator's queues still open, so each worker gets the message that ends it (a cycle
    # left them to the garbage collector, which closed the queues first: 5 s a worker).
    collecting = gc.isenabled()
    gc.disable()
    try:
        loader = wrap(Tagged(data(), batch_size=4, num_workers=2, persistent_workers=persistent))
        iterator = iter(loader)
        next(iterator)
        processes, freed = list(iterator._workers), weakref.ref(loader)
        start = time.monotonic()
        del loader, iterator
        assert freed() is None, "the loader is in a reference cycle"
        assert not any(process.is_alive() for process in processes)
        assert time.monotonic() - start < 1.0
    finally:
        if collecting:
            gc.enable()


def test_a_wrapped_loader_pickles_and_its_copy_iterates() -> None:
    loader = worker_safe(_watched(Tagged(data(), batch_size=4)))
    copy = pickle.loads(pickle.dumps(loader))
    assert [batch[0].tolist() for batch in copy] == [batch[0].tolist() for batch in loader]
