"""What a loader's worker start costs by start method, with and without the library's hold of the preemption
signals (issue 54).

``python benchmarks/worker_starts.py [ROUNDS]`` times, in one process, the seconds from ``iter(loader)`` to its
first batch (2 workers, a small map-style dataset) for workers started by fork, forkserver and spawn, alternating
rounds without the hold (plain torch) and with it (what a fit with the callback does: every worker's target is
the library's, a spawned worker starts with the signals blocked, the forkserver is the library's). Prints the
median per method and the ratio with/without. The forkserver's own start (once per process) is kept out: it is
started before the rounds, by the library in the rounds with the hold (see `worker_starts._ensure_forkserver`).
"""

from __future__ import annotations

import signal
import statistics
import sys
import time
from collections.abc import Callable

import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_resumable.readers.worker_signals import (
    DeferredSignals,
    leave_signals_to_this_process,
    stop_leaving_signals,
)
from lightning_resumable.readers.worker_starts import leave_signals_to_workers, stop_leaving_signals_to_workers

METHODS = ("fork", "forkserver", "spawn")


def first_batch_s(method: str) -> float:
    loader = DataLoader(TensorDataset(torch.arange(64)), batch_size=8, num_workers=2, multiprocessing_context=method)
    start = time.perf_counter()
    iterator = iter(loader)
    next(iterator)
    elapsed = time.perf_counter() - start
    del iterator
    return elapsed


def held(measure: Callable[[], float]) -> float:
    signals = DeferredSignals([signal.SIGTERM, signal.SIGUSR1])
    signals.install()
    leave_signals_to_workers(leave_signals_to_this_process(signals.signums), signals.signums)
    try:
        return measure()
    finally:
        stop_leaving_signals()
        stop_leaving_signals_to_workers()
        signals.uninstall()


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    torch.set_num_threads(1)
    times: dict[tuple[str, bool], list[float]] = {(method, hold): [] for method in METHODS for hold in (False, True)}
    for method in METHODS:  # warm: the forkserver, the page cache of torch's files
        first_batch_s(method)
        held(lambda method=method: first_batch_s(method))
    for _ in range(rounds):
        for method in METHODS:
            for hold in (False, True):
                measure = lambda method=method: first_batch_s(method)  # noqa: E731
                times[(method, hold)].append(held(measure) if hold else measure())
    print(f"iter(loader) to its first batch, 2 workers, median of {rounds} rounds (seconds)")
    print(f"{'start method':<14}{'plain torch':>12}{'with the hold':>15}{'ratio':>8}")
    for method in METHODS:
        plain, library = statistics.median(times[(method, False)]), statistics.median(times[(method, True)])
        print(f"{method:<14}{plain:>12.3f}{library:>15.3f}{library / plain:>7.2f}x")


if __name__ == "__main__":
    main()
