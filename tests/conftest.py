"""Which ``lightning_resumable`` the tests run against; CI requires the installed wheel."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter
from torchdata.stateful_dataloader.stateful_dataloader import _StatefulMultiProcessingDataLoaderIter

import lightning_resumable
from lightning_resumable.readers.worker_signals import (
    DeferredSignals,
    leave_signals_to_this_process,
    stop_leaving_signals,
)
from lightning_resumable.readers.worker_starts import leave_signals_to_workers, stop_leaving_signals_to_workers

SOURCE_TREE = Path(__file__).resolve().parents[1] / "src"


def pytest_report_header() -> str:
    return f"lightning_resumable {lightning_resumable.__version__} from {Path(lightning_resumable.__file__).parent}"


def pytest_configure() -> None:
    # Under pytest-xdist each worker runs its tests in a session of its own, as a lone pytest does: a test that
    # signals its process group (as a scheduler signals a job) reaches its own processes, never another worker's.
    if os.environ.get("PYTEST_XDIST_WORKER") and os.getpgrp() != os.getpid():
        os.setsid()
    # .ci/run installs the built wheel and sets this, so the suite cannot pass on the source tree by accident.
    if (
        os.environ.get("LIGHTNING_RESUMABLE_REQUIRE_INSTALLED")
        and SOURCE_TREE in Path(lightning_resumable.__file__).parents
    ):
        raise pytest.UsageError(f"the tests must run against the installed wheel, not {lightning_resumable.__file__}")


SHUTDOWN_BOUND_S = 1.0
"""A loader's workers end within milliseconds of the message that ends them; torch waits 5 s for each worker whose
message never reached it (its queue closed first, by the garbage collector freeing a loader in a reference cycle)."""
NOT_FORKED_SHUTDOWN_BOUND_S = 4.0
"""A worker started by spawn or forkserver ends through its interpreter's finalization (its modules, torch's, torn
down): tenths of a second, over a second on 2 busy cores; still well under torch's 5 s wait for a lost message."""
_slow_shutdowns: list[str] = []


def _forked(iterator: Any) -> bool:
    workers = getattr(iterator, "_workers", [])
    kind = type(workers[0]).__name__ if workers else "ForkProcess"
    return kind == "ForkProcess" or (kind == "Process" and multiprocessing.get_start_method() == "fork")


def _timed_shutdown(shutdown: Any) -> Any:
    def timed(iterator: Any) -> None:
        start = time.monotonic()
        shutdown(iterator)
        took = time.monotonic() - start
        if took > (SHUTDOWN_BOUND_S if _forked(iterator) else NOT_FORKED_SHUTDOWN_BOUND_S):
            dataset = type(getattr(iterator, "_dataset", None)).__name__
            _slow_shutdowns.append(f"{took:.1f} s to shut down the workers of an iterator over {dataset}")

    return timed


for _iterator_class in (_MultiProcessingDataLoaderIter, _StatefulMultiProcessingDataLoaderIter):
    _iterator_class._shutdown_workers = _timed_shutdown(_iterator_class._shutdown_workers)  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
def _loaders_shut_down_at_once() -> Iterator[None]:
    """Fail the test during which any loader iterator (of this test, or an earlier one freed now) took over
    `SHUTDOWN_BOUND_S` to shut its workers down: in the suite's order, not only alone."""
    yield
    slow, _slow_shutdowns[:] = list(_slow_shutdowns), []
    assert slow == [], slow


@pytest.fixture
def holding() -> Iterator[DeferredSignals]:
    """This process holds SIGTERM and SIGUSR1, as a rank does during a fit: every process it starts (by fork,
    forkserver or spawn) leaves them to it (`tests/test_signals.py`, `tests/test_worker_starts.py`)."""
    signals = DeferredSignals([signal.SIGTERM, signal.SIGUSR1])
    assert signals.install()
    leave_signals_to_workers(leave_signals_to_this_process(signals.signums), signals.signums)
    try:
        yield signals
    finally:
        stop_leaving_signals()
        stop_leaving_signals_to_workers()
        signals.uninstall()
