"""`lightning_resumable.internals._torchdata` against the installed torchdata: a real stream loader's state passes
the structure check for its number of workers, and damaged ones are refused with `StateFormatError`
before torchdata sees them (torchdata raised ``KeyError``/``RuntimeError``, or read the stream again
from its start when a worker's state was ``{}``)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from lightning_resumable import StateFormatError
from lightning_resumable.internals._torchdata import check_loader_state

from .helpers import loader_state, stream_loader


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_real_loader_state_passes_for_its_number_of_workers_only(num_workers: int) -> None:
    check_loader_state(loader_state(num_workers), num_workers, rank=0)
    with pytest.raises(StateFormatError, match="rank 1's stream loader state"):
        check_loader_state(loader_state(num_workers), 2 - num_workers, rank=1)


def _damaged(num_workers: int, path: tuple[str, ...], value: object) -> dict[str, Any]:
    state = copy.deepcopy(loader_state(num_workers))
    parent = state
    for key in path[:-1]:
        parent = parent[key]
    if value is KeyError:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return state


WORKER_0 = ("_snapshot", "_worker_snapshots", "worker_0")
DAMAGES = [
    (0, ("dataset_state",), KeyError, "lacks the key 'dataset_state'"),
    (0, ("dataset_state",), {}, "lacks the key 'stream'"),
    (0, ("dataset_state", "yielded"), -1, "must not be negative"),
    (0, ("dataset_state", "yielded"), True, "must be int, got bool"),
    (0, ("_num_yielded",), "3", "must be int, got str"),
    (0, ("_iterator_finished",), 0, "must be bool"),
    (0, ("fetcher_state",), None, "must be dict"),
    (2, ("_snapshot",), {}, "lacks the key '_snapshot_step'"),
    (2, ("_snapshot", "_main_snapshot", "_num_workers"), 3, "holds 3 workers' snapshots"),
    (2, ("_snapshot", "_worker_snapshots", "worker_1"), KeyError, r"\['worker_0'\]"),
    (2, (*WORKER_0, "dataset_state"), {}, "of worker_0\\['dataset_state'\\] lacks the key 'stream'"),
    (2, (*WORKER_0, "worker_id"), 1, "is the state of worker 1"),
    (2, WORKER_0, {}, "of worker_0 lacks the key 'worker_id'"),
]


@pytest.mark.parametrize(("num_workers", "path", "value", "message"), DAMAGES)
def test_a_damaged_loader_state_is_refused(
    num_workers: int, path: tuple[str, ...], value: object, message: str
) -> None:
    with pytest.raises(StateFormatError, match=message):
        check_loader_state(_damaged(num_workers, path, value), num_workers, rank=0)


@pytest.mark.parametrize("state", [{}, None, [], 0])
def test_an_emptied_loader_state_is_refused(state: object) -> None:
    for num_workers in (0, 2):
        with pytest.raises(StateFormatError, match="rank 3's stream loader state"):
            check_loader_state(state, num_workers, rank=3)


def test_torchdata_itself_reads_a_stream_from_its_start_after_an_emptied_state() -> None:
    """Why the check exists: torchdata restores a loader from a state of ``{}`` without an error, and the
    stream is read from its start again: the 2 batches trained before the save are trained twice."""
    full = [batch.tolist() for batch in stream_loader(0)]
    restored = stream_loader(0)
    restored.resume_from({}, batches=2)
    assert [batch.tolist() for batch in restored] == full


def test_a_state_taken_before_iter_makes_the_iterator_the_next_iter_hands_out() -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    from lightning_resumable.internals._torchdata import holds_restored_iterator, take_iterator

    loader = StatefulDataLoader(list(range(8)), batch_size=2)
    assert take_iterator(loader) is None and not holds_restored_iterator(loader)
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    assert not holds_restored_iterator(loader), "iter() made the iterator"
    assert take_iterator(loader) is iterator and take_iterator(loader) is None
    restored = StatefulDataLoader(list(range(8)), batch_size=2)
    restored.load_state_dict(state)
    assert not holds_restored_iterator(restored)
    restored.state_dict()  # before any iter(): torchdata makes the iterator, with the restored state
    assert holds_restored_iterator(restored)
    made = take_iterator(restored)
    restored._iterator = made  # put back: the next iter() hands it out
    resumed = iter(restored)
    assert resumed is made and not holds_restored_iterator(restored)
    assert [batch.tolist() for batch in resumed] == [[2, 3], [4, 5], [6, 7]]
