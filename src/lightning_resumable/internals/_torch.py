"""torch's ``DataLoader`` internals the library relies on: the one module that names them.

torch has no public way to act when a loader makes an iterator, to see each batch an iterator hands
out, or to wait until a finished iterator's workers and queue threads have ended. These are the
private names used for that, each tested against the installed torch by
``tests/test_torch_internals.py`` (as `lightning_resumable.internals._lightning` is for Lightning's):

- ``DataLoader._get_iterator``: ``DataLoader.__iter__`` makes every iterator through it.
- an iterator's ``_next_data`` (called by ``_BaseDataLoaderIter.__next__`` for each batch) and
  ``_num_yielded`` (the batches it has handed out).
- a multi-process iterator's ``_workers``, ``_index_queues``, ``_shutdown`` and ``_shutdown_workers``,
  and ``multiprocessing.Queue``'s feeder thread ``_thread``.
- in a worker, ``signal_handling._set_worker_signal_handlers`` (the first call of torch's and torchdata's
  ``_worker_loop``, looked up on the module at each call) and that loop's ``done_event`` argument, a
  ``multiprocessing.Event``, whose semaphore ``_flag`` `is_set_without_locking` reads.
- the worker loop each multi-process iterator gives its worker processes as their target: torch's
  ``_utils.worker._worker_loop`` and torchdata's ``stateful_dataloader._worker_loop``, looked up on those
  modules as each iterator starts its workers (`replace_worker_loops`); and the iterators' ``__init__``,
  where they start them (`guard_worker_starts`).
- ``_utils.worker._worker_info`` and ``WorkerInfo``: what ``get_worker_info()`` answers, set while another layout's
  worker's stream is read (`read_as_worker`).
"""

from __future__ import annotations

import signal
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from torch.utils.data import DataLoader

__all__ = [
    "ClassFactory",
    "MakesIterators",
    "after_worker_signal_setup",
    "batches_handed_out",
    "guard_worker_starts",
    "has_shut_down",
    "is_set_without_locking",
    "iterator_factory",
    "next_batch_function",
    "read_as_worker",
    "replace_next_batch",
    "replace_worker_loops",
    "retire_iterator",
    "set_iterator_factory",
    "uses_worker_processes",
]

MakeIterator = Callable[[], Any]


class MakesIterators:
    """A mixin for a ``DataLoader`` class: each iterator it makes is ``self.make_iterator(make)``."""

    def make_iterator(self, make: MakeIterator) -> Any:
        return make()

    def _get_iterator(self) -> Any:
        return self.make_iterator(super()._get_iterator)  # type: ignore[misc]


def iterator_factory(loader: DataLoader[Any]) -> MakeIterator:
    """What makes ``loader``'s next iterator now: its own factory, or its class's, holding ``loader`` weakly."""
    own: MakeIterator | None = loader.__dict__.get("_get_iterator")
    return own if own is not None else ClassFactory(loader)


def set_iterator_factory(loader: DataLoader[Any], make: MakeIterator) -> None:
    """Make ``loader``'s iterators with ``make`` from now on; its class stays its own.

    ``make`` is kept in the loader's own attributes, so it must hold the loader weakly (`ClassFactory`,
    `weakref.ref`): a loader in a reference cycle with its factory is freed by the garbage collector, which
    first runs its iterator's queues' finalisers, closing them, and then the iterator's ``__del__``, whose
    message that ends each worker can no longer be sent: torch waits 5 s for each worker before it kills it.
    """
    loader._get_iterator = make  # type: ignore[method-assign]


class ClassFactory:
    """``loader``'s class's ``_get_iterator``, called on ``loader``, which it holds weakly (pickled with it)."""

    def __init__(self, loader: DataLoader[Any]) -> None:
        self.loader = weakref.ref(loader)

    def __call__(self) -> Any:
        loader = self.loader()
        if loader is None:
            raise ReferenceError("the DataLoader that made this iterator factory is gone")
        return type(loader)._get_iterator(loader)

    def __reduce__(self) -> tuple[Any, ...]:
        return ClassFactory, (self.loader(),)


def next_batch_function(iterator: Any) -> Callable[[Any], Any] | None:
    """The unbound function that reads ``iterator``'s next batch, ``None`` if it is not torch's iterator."""
    if getattr(iterator, "_next_data", None) is None or not hasattr(iterator, "_num_yielded"):
        return None
    read: Callable[[Any], Any] = type(iterator)._next_data
    return read


def replace_next_batch(iterator: Any, read: Callable[[], Any]) -> None:
    """``iterator`` reads each batch with ``read()`` from now on (its class stays torch's, as
    Lightning's worker shutdown checks)."""
    iterator._next_data = read


def batches_handed_out(iterator: Any) -> int:
    """The batches ``iterator`` has handed out in its pass."""
    count: int = iterator._num_yielded
    return count


def uses_worker_processes(iterator: object) -> bool:
    """Whether ``iterator`` is a multi-process one (whose threads end when its pass does)."""
    return hasattr(iterator, "_workers")


def has_shut_down(iterator: object) -> bool:
    """Whether torch has shut ``iterator``'s workers down (its pass ended, or it was retired)."""
    return bool(getattr(iterator, "_shutdown", False))


def retire_iterator(iterator: object, timeout: float) -> None:
    """Shut down ``iterator``'s workers and wait (each at most ``timeout`` seconds) until its processes
    and its index queues' feeder threads have ended. Idempotent; nothing to do for a single-process one."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if callable(shutdown):
        shutdown()  # joins the workers (terminating stragglers) and closes the index queues
    for worker in getattr(iterator, "_workers", ()):
        worker.join(timeout=timeout)
    for queue in getattr(iterator, "_index_queues", ()):
        feeder = getattr(queue, "_thread", None)
        if isinstance(feeder, threading.Thread) and feeder is not threading.current_thread():
            feeder.join(timeout=timeout)


def after_worker_signal_setup(started: Callable[[Any], None], unblock: Iterable[int] = ()) -> None:
    """In this process, call ``started(done_event)`` right after a loader worker's loop has set torch's
    own signal handlers: ``done_event`` is the event its loader sets when it shuts its workers down (``None``
    if the caller is not such a loop). A process that never runs a worker loop never calls it.

    SIGTERM is blocked from before torch sets its handler (which ends a worker on a SIGTERM not from its parent)
    until ``started`` has returned: one that arrives meanwhile waits, and goes to the handler ``started`` set.
    ``unblock``: signals the process started with blocked (a worker started by spawn), unblocked then too."""
    from torch.utils.data._utils import signal_handling

    set_handlers = signal_handling._set_worker_signal_handlers  # type: ignore[attr-defined]
    unblocked = set(unblock)

    def set_handlers_then_start(*args: Any) -> None:
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # the worker has no other thread yet
        try:
            set_handlers(*args)
            started(sys._getframe(1).f_locals.get("done_event"))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, set(mask) - unblocked)

    signal_handling._set_worker_signal_handlers = set_handlers_then_start  # type: ignore[attr-defined]


def is_set_without_locking(event: Any) -> bool:
    """Whether a ``multiprocessing.Event`` is set, read from a signal handler: ``is_set()`` takes the event's
    lock, which the interrupted code may hold (torch's worker loop checks its ``done_event`` all the time), and
    the handler would then wait for itself. Its flag is a semaphore at 1 once set; another process's
    ``is_set()`` takes it for an instant, when this reads "not set"."""
    try:
        return bool(event._flag.get_value())
    except NotImplementedError:  # no sem_getvalue (macOS)
        return bool(event.is_set())


WorkerLoop = Callable[..., Any]
_WORKER_LOOP_HOMES = (
    ("torch.utils.data._utils.worker", "_worker_loop"),  # torch's iterator reads it there at each start
    ("torchdata.stateful_dataloader.stateful_dataloader", "_worker_loop"),  # torchdata's imported name
)
_MULTI_PROCESS_ITERATORS = (
    ("torch.utils.data.dataloader", "_MultiProcessingDataLoaderIter"),
    ("torchdata.stateful_dataloader.stateful_dataloader", "_StatefulMultiProcessingDataLoaderIter"),
)


def _homes(names: tuple[tuple[str, str], ...]) -> list[tuple[Any, str]]:
    import importlib

    return [(importlib.import_module(module), name) for module, name in names]


def replace_worker_loops(wrap: Callable[[WorkerLoop], WorkerLoop]) -> Callable[[], None]:
    """Every worker process a torch or torchdata loader starts from now on runs ``wrap(loop)`` (``loop``: the
    worker loop it would have run) as its target, whatever its start method; the returned function puts the
    loops back. ``wrap(loop)`` is pickled for a worker that is not forked."""
    replaced = []
    for module, name in _homes(_WORKER_LOOP_HOMES):
        loop = getattr(module, name)
        setattr(module, name, wrap(loop))
        replaced.append((module, name, loop))

    def restore() -> None:
        for module, name, loop in replaced:
            setattr(module, name, loop)

    return restore


def guard_worker_starts(guard: Callable[[DataLoader[Any]], AbstractContextManager[Any]]) -> Callable[[], None]:
    """Every multi-process iterator of torch and torchdata starts its worker processes inside
    ``guard(loader)`` from now on; the returned function ends that."""
    replaced = []
    for module, name in _homes(_MULTI_PROCESS_ITERATORS):
        iterator_class = getattr(module, name)
        start = iterator_class.__dict__["__init__"]

        def guarded_start(self: Any, loader: DataLoader[Any], *args: Any, __start: Any = start, **kwargs: Any) -> None:
            with guard(loader):
                __start(self, loader, *args, **kwargs)

        iterator_class.__init__ = guarded_start
        replaced.append((iterator_class, start))

    def restore() -> None:
        for iterator_class, start in replaced:
            iterator_class.__init__ = start

    return restore


def read_as_worker(items: Iterator[Any], worker: int | None, workers: int, dataset: Any) -> Iterator[Any]:
    """``items``, each read while torch's ``get_worker_info()`` answers as in worker ``worker`` of ``workers``
    (``None``: as in a process without workers), whatever the reading process is: a stream that splits itself by
    the worker it runs in (a Hugging Face stream) reads another layout's worker's share."""
    from torch.utils.data._utils import worker as torch_worker

    info = None if worker is None else torch_worker.WorkerInfo(id=worker, num_workers=workers, seed=0, dataset=dataset)
    while True:
        own, torch_worker._worker_info = torch_worker._worker_info, info
        try:
            item = next(items)
        except StopIteration:
            return
        finally:
            torch_worker._worker_info = own
        yield item
