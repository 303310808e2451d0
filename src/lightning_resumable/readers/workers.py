"""Forking loader workers only when no thread of the previous pass is still ending.

On CPython 3.11 before 3.11.10 (and 3.8-3.10 before their September 2024 releases), a process forked
while another thread of the parent held the runtime's ``HEAD_LOCK`` (a thread being created or torn
down) deadlocks in the child's after-fork cleanup (``PyOS_AfterFork_Child`` ->
``_PyThreadState_DeleteExcept``; CPython gh-112275, fixed by PR #112336), and the rank waits for that
worker forever. The threads that end around a loader's fork are the previous pass's: its index
queues' feeder threads, closed when the pass ended but left to finish on their own.

Every loader this library builds therefore *retires* its previous iterator before it forks new
workers: it shuts that iterator's workers down and joins its worker processes and its queues'
feeder threads, so none of them is ending during the fork. It also joins the feeder threads of every
other iterator of its loaders that has already shut down: a ``CombinedLoader`` ends one loader's
pass while another goes on, and the first one's threads end while the next loader forks.
The fork itself runs with the garbage collector paused, so no finaliser closes another iterator's
queues meanwhile, and only once no native thread runs: a gloo thread entering Python after a
collective is the other way into that lock (`lightning_resumable.readers.quiet_fork`). On an affected
CPython the first such fork warns once, on rank 0, because a user's own loaders (a validation loader
with workers) do not retire their previous pass first (during a fit with the callback their forks do
wait for the native threads).
"""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader

from lightning_resumable.internals._torch import (
    MakesIterators,
    has_shut_down,
    iterator_factory,
    retire_iterator,
    set_iterator_factory,
    uses_worker_processes,
)
from lightning_resumable.readers.quiet_fork import FORK_DEADLOCK_FIXED_IN, affected_python, guarded_forks
from lightning_resumable.readers.worker_starts import start_method

__all__ = [
    "FORK_DEADLOCK_FIXED_IN",
    "ForkingEachPass",
    "RetiringLoader",
    "WorkerSafeDataLoader",
    "forking",
    "forks_workers",
    "garbage_collector_paused",
    "retire",
    "retire_ended",
    "retire_previous",
    "warn_once_on_affected_python",
    "worker_safe",
]

_JOIN_TIMEOUT_S = 30.0
"""A feeder thread ends within microseconds of its queue's close; this bound only keeps a broken
queue from hanging the rank here instead."""

_warned = False
_iterators: weakref.WeakSet[Any] = weakref.WeakSet()
"""The iterators with workers that the library's loaders made in this process (see `forking`)."""


@contextmanager
def garbage_collector_paused() -> Iterator[None]:
    """No finaliser (and so no queue closing, no thread ending) runs from a collection while the block forks."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


@contextmanager
def forking(make: Callable[[], Any]) -> Iterator[Any]:
    """``make()``, an iterator that forks workers, made once no thread of an ended pass is ending: the
    feeder threads of every shut-down iterator of the library's loaders are joined first, and no
    collection runs during the fork, which waits for the native threads to sleep (`guarded_forks`).
    The new iterator is registered for the next fork."""
    retire_ended()
    with garbage_collector_paused(), guarded_forks():
        iterator = make()
    yield iterator
    if uses_worker_processes(iterator):  # its threads end when its pass does
        _iterators.add(iterator)


def retire_ended() -> None:
    """Wait for the feeder threads of every shut-down iterator of the library's loaders to end."""
    for ended in [each for each in _iterators if has_shut_down(each)]:
        retire(ended)  # torch shut its workers down at its pass's end; its feeder threads may still be ending
        _iterators.discard(ended)


def retire(iterator: object) -> None:
    """Shut down a loader iterator's workers and wait until its processes and feeder threads have ended.

    Idempotent; a single-process iterator (``num_workers=0``) has nothing to retire (torch's
    internals: `lightning_resumable.internals._torch`).
    """
    retire_iterator(iterator, _JOIN_TIMEOUT_S)


def forks_workers(loader: DataLoader[Any]) -> bool:
    """Whether iterating ``loader`` forks worker processes (``num_workers > 0`` with the fork start method)."""
    return loader.num_workers > 0 and start_method(loader) == "fork"


def warn_once_on_affected_python(loader: DataLoader[Any]) -> None:
    """Warn once per process, on rank 0, when ``loader`` is about to fork workers on an affected CPython."""
    global _warned
    if _warned or not affected_python() or not forks_workers(loader):
        return
    _warned = True
    version = ".".join(str(part) for part in sys.version_info[:3])
    rank_zero_warn(
        f"lightning_resumable: CPython {version} can deadlock a forked loader worker when another thread is"
        " starting or ending during the fork (CPython gh-112275, fixed in 3.11.10 and 3.12). The train loaders"
        " of this library retire their previous workers and threads before forking; during a fit with the callback"
        " every fork waits until no native thread runs, but the previous workers and threads of loaders of your own"
        " with num_workers > 0 (validation, test) are not retired first. Upgrade Python, or use"
        " multiprocessing_context='forkserver' for those loaders",
        category=RuntimeWarning,
    )


def _iterator_after_retiring(loader: DataLoader[Any], make: Callable[[], Any]) -> Any:
    """``make()`` (a new iterator of ``loader``), once ``loader``'s previous iterator is retired."""
    if not forks_workers(loader):
        return make()
    previous = loader.__dict__.pop("_previous_iterator", None)
    if previous is not None:
        retire(previous)
        del previous
    warn_once_on_affected_python(loader)
    with forking(make) as iterator:
        loader._previous_iterator = iterator
    return iterator


def retire_previous(loader: DataLoader[Any]) -> None:
    """Retire the iterator a `RetiringLoader` (or a `worker_safe` loader) keeps until its next pass: at
    the end of a fit, so that no worker outlives it (at the interpreter's exit, multiprocessing would
    SIGTERM them)."""
    previous = loader.__dict__.pop("_previous_iterator", None)
    if previous is not None:
        retire(previous)


class RetiringLoader(MakesIterators, DataLoader[Any]):
    """A ``DataLoader`` that retires its previous iterator before it forks the next one's workers."""

    def make_iterator(self, make: Callable[[], Any]) -> Any:
        return _iterator_after_retiring(self, make)


class ForkingEachPass(MakesIterators):
    """A mixin for a data library's loader that makes a new torch iterator each pass (LitData's,
    Mosaic's): each made as `forking` makes it, and every one still alive retired at the end of a
    fit. An iterator Lightning left unexhausted (``max_steps``, a preemption, the read-ahead of a
    save) keeps its workers waiting on their index queues: they end with the fit, not at the
    interpreter's exit."""

    def make_iterator(self, make: Callable[[], Any]) -> Any:
        with forking(make) as iterator:
            pass
        self.__dict__.setdefault("_made_iterators", weakref.WeakSet()).add(iterator)
        return iterator

    def retire_workers(self) -> None:
        """Retire every iterator this loader made that is still alive, then the ended ones' threads."""
        for iterator in list(self.__dict__.get("_made_iterators", ())):
            retire(iterator)
        retire_ended()


class WorkerSafeDataLoader(RetiringLoader):
    """The ``DataLoader`` the library builds for a map-style loader (see `RetiringLoader`)."""


def worker_safe(loader: DataLoader[Any]) -> DataLoader[Any]:
    """``loader`` itself, retiring its previous iterator before each fork as a `RetiringLoader` does.

    For a user's ``DataLoader`` subclass that Lightning rebuilt: its class stays its own, and only
    this instance's iterator factory is wrapped.
    """
    if isinstance(loader, RetiringLoader):
        return loader
    set_iterator_factory(loader, _RetiringFactory(loader, iterator_factory(loader)))
    return loader


class _RetiringFactory:
    """A `worker_safe` loader's iterator factory, holding the loader weakly (`set_iterator_factory` says why)."""

    def __init__(self, loader: DataLoader[Any], make: Callable[[], Any]) -> None:
        self.loader, self.make = weakref.ref(loader), make

    def __call__(self) -> Any:
        loader = self.loader()
        if loader is None:
            raise ReferenceError("the DataLoader that made this iterator factory is gone")
        return _iterator_after_retiring(loader, self.make)

    def __reduce__(self) -> tuple[Any, ...]:
        return _RetiringFactory, (self.loader(), self.make)
