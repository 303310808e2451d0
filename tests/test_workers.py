"""Loaders the library builds retire their previous iterator (workers and feeder threads ended)
before forking new workers, and warn once on a CPython with the after-fork deadlock."""

from __future__ import annotations

import threading
import warnings
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_resumable import workers
from lightning_resumable.workers import WorkerSafeDataLoader, worker_safe


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
    monkeypatch.setattr(workers, "FORK_DEADLOCK_FIXED_IN", (99, 0, 0))
    loader = WorkerSafeDataLoader(data(), batch_size=4, num_workers=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            list(loader)
    assert len([w for w in caught if "gh-112275" in str(w.message)]) == 1
    monkeypatch.setattr(workers, "_warned", False)
    monkeypatch.setattr(workers, "FORK_DEADLOCK_FIXED_IN", (3, 0, 0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        list(loader)
    assert not [w for w in caught if "gh-112275" in str(w.message)]
