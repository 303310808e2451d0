"""Starting loader workers without a Python thread ending during the fork.

On Python 3.11 a worker forked while another thread of the process was ending (a loader queue's
feeder thread, finalised by the garbage collector) deadlocked in CPython's after-fork cleanup
(``PyOS_AfterFork_Child`` -> ``_PyThreadState_DeleteExcept``), and the rank waited for it forever.
The loaders this library builds therefore fork their workers with the garbage collector paused, and
the stream loader also retires its previous iterator first.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch.utils.data import DataLoader

__all__ = ["WorkerSafeDataLoader", "garbage_collector_paused"]


@contextmanager
def garbage_collector_paused() -> Iterator[None]:
    """No finaliser (and so no thread ending) runs from a collection while the block forks workers."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


class WorkerSafeDataLoader(DataLoader[Any]):
    """A ``DataLoader`` that forks its workers with the garbage collector paused."""

    def _get_iterator(self) -> Any:
        if self.num_workers == 0:
            return super()._get_iterator()
        with garbage_collector_paused():
            return super()._get_iterator()
