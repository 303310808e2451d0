"""torchdata's ``StatefulDataLoader`` state as its releases write it: the one place that knows its keys.

Promise: `check_loader_state` refuses a stream loader's state, with `StateFormatError` naming the
rank and the path, unless it has the structure the installed torchdata writes for that number of
workers, with the library's own stream state in it for each worker. torchdata itself raises
``KeyError``/``RuntimeError`` on a damaged state, or restarts the stream from its start when the
dataset's state is gone. The keys are torchdata's (``stateful_dataloader.py``; the same from 0.10
to 0.11) and are tested against the installed release (``tests/test_torchdata_internals.py``), as are
the two private attributes of a ``StatefulDataLoader`` the stream loader reads: the iterator it holds
(``_iterator``) and whether a ``state_dict()`` made it (``_initial_iter_for_state_dict``).
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Mapping
from typing import Any

from lightning_resumable.errors import StateFormatError

__all__ = [
    "check_loader_state",
    "dataset_states",
    "holds_restored_iterator",
    "take_iterator",
    "torchdata_release",
    "torchdata_version",
]

# What a state without workers holds (the main process's iterator), and the type of each value.
_IN_PROCESS: dict[str, type | tuple[type, ...]] = {
    "_iterator_finished": bool,
    "_num_yielded": int,
    "_sampler_iter_yielded": int,
    "_sampler_iter_state": (dict, type(None)),
    "_index_sampler_state": (dict, type(None)),
    "fetcher_state": dict,
    "dataset_state": dict,
}
# With workers: a snapshot of the main process's iterator and of each worker's.
_WITH_WORKERS: dict[str, type | tuple[type, ...]] = {
    "_iterator_finished": bool,
    "_steps_since_snapshot": int,
    "_snapshot": dict,
}
_SNAPSHOT: dict[str, type | tuple[type, ...]] = {
    "_snapshot_step": int,
    "_last_yielded_worker_id": int,
    "_main_snapshot": dict,
    "_worker_snapshots": dict,
}
_MAIN_SNAPSHOT: dict[str, type | tuple[type, ...]] = {
    "_num_workers": int,
    "_sampler_iter_yielded": int,
    "_sampler_iter_state": (dict, type(None)),
    "_index_sampler_state": (dict, type(None)),
}
_WORKER: dict[str, type | tuple[type, ...]] = {"worker_id": int, "fetcher_state": dict, "dataset_state": dict}
_STREAM: dict[str, type | tuple[type, ...]] = {"stream": object, "yielded": int}
"""`lightning_resumable.readers.streams.SeededStream`'s state: the user's stream's, and its sample count."""


def holds_restored_iterator(loader: Any) -> bool:
    """Whether ``loader``'s iterator was made by a ``state_dict()`` before its next ``iter()``, which hands
    that iterator out instead of making another (after a restore, it holds the restored state)."""
    return bool(loader._initial_iter_for_state_dict)


def take_iterator(loader: Any) -> Any:
    """``loader``'s last iterator (``None`` if it has none), which it no longer holds: the next ``iter()``
    makes a new one."""
    previous, loader._iterator = loader._iterator, None
    return previous


def torchdata_version() -> str:
    """The installed torchdata's version: its ``StatefulDataLoader`` state format is what a stream saves."""
    return importlib.metadata.version("torchdata")


def torchdata_release(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a version such as ``0.11.0`` or ``0.12.0.dev20260101``."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None:
        raise StateFormatError(f"not a torchdata version: {version!r}")
    return int(found.group(1)), int(found.group(2))


def _check(raw: object, expected: Mapping[str, type | tuple[type, ...]], path: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise StateFormatError(f"{path} must be a dict, got {type(raw).__name__}")
    for key, types in expected.items():
        if key not in raw:
            raise StateFormatError(f"{path} lacks the key {key!r}")
        value = raw[key]
        if not isinstance(value, types) or (types is int and isinstance(value, bool)):
            names = types.__name__ if isinstance(types, type) else " or ".join(each.__name__ for each in types)
            raise StateFormatError(f"{path}[{key!r}] must be {names}, got {type(value).__name__}")
        if isinstance(value, int) and value < 0:
            raise StateFormatError(f"{path}[{key!r}] must not be negative, got {value}")
    return raw


def check_loader_state(state: object, num_workers: int, rank: int) -> None:
    """Raise `StateFormatError` unless ``state`` is a stream loader's state for ``num_workers`` workers."""
    where = f"rank {rank}'s stream loader state"
    if num_workers == 0:
        checked = _check(state, _IN_PROCESS, where)
        _check(checked["dataset_state"], _STREAM, f"{where}['dataset_state']")
        return
    checked = _check(state, _WITH_WORKERS, where)
    snapshot = _check(checked["_snapshot"], _SNAPSHOT, f"{where}['_snapshot']")
    main = _check(snapshot["_main_snapshot"], _MAIN_SNAPSHOT, f"{where}['_snapshot']['_main_snapshot']")
    workers = snapshot["_worker_snapshots"]
    expected_workers = {f"worker_{worker}" for worker in range(num_workers)}
    if main["_num_workers"] != num_workers or set(workers) != expected_workers:
        raise StateFormatError(
            f"{where} holds {main['_num_workers']} workers' snapshots {sorted(workers, key=str)[:8]}; the"
            f" stream state records {num_workers} workers"
        )
    for name in sorted(expected_workers):
        worker = _check(workers[name], _WORKER, f"{where} of {name}")
        if worker["worker_id"] != int(name.removeprefix("worker_")):
            raise StateFormatError(f"{where} of {name} is the state of worker {worker['worker_id']}")
        _check(worker["dataset_state"], _STREAM, f"{where} of {name}['dataset_state']")


def dataset_states(state: Mapping[str, Any], num_workers: int) -> list[Mapping[str, Any]]:
    """The dataset's state in each worker of a stream loader's ``state`` (checked by `check_loader_state`), in
    worker order; without workers, the one of the main process."""
    if num_workers == 0:
        return [state["dataset_state"]]
    workers = state["_snapshot"]["_worker_snapshots"]
    return [workers[f"worker_{worker}"]["dataset_state"] for worker in range(num_workers)]
