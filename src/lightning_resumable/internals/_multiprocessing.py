"""multiprocessing's forkserver and resource-tracker internals the library relies on: the one module that
names them.

multiprocessing has no public way to read the forkserver's preload list (only to replace it), to ask
whether its server runs, or to start another without waiting for the first to end. The library adds a module
of its own to that list and starts the server itself while a rank holds preemption signals
(`lightning_resumable.readers.worker_starts`); it also keeps the resource tracker from the held signals
(`protect_resource_tracker`). Tested against the installed Python by
``tests/test_worker_starts.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterable
from multiprocessing import forkserver, resource_tracker, util
from typing import Any, NoReturn

__all__ = [
    "abandon_forkserver",
    "end_as_a_forked_process_ends",
    "ensure_resource_tracker",
    "forkserver_pid",
    "forkserver_preload",
    "protect_resource_tracker",
    "start_forkserver",
]

_abandoned: list[int] = []


def forkserver_preload() -> list[str]:
    """The modules the forkserver imports as it starts (``['__main__']`` unless set)."""
    modules: list[str] = list(forkserver._forkserver._preload_modules)  # type: ignore[attr-defined]
    return modules


def forkserver_pid() -> int | None:
    """The pid of this process's forkserver, ``None`` if it has not started one (or it was found dead)."""
    pid: int | None = forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
    return pid


def start_forkserver() -> int:
    """Start this process's forkserver now (``ensure_running``, public but undocumented); its pid."""
    forkserver.ensure_running()
    pid = forkserver_pid()
    assert pid is not None
    return pid


def abandon_forkserver() -> None:
    """Let this process's forkserver go without waiting for it (``_stop`` would wait until every process holding
    its pipe, a forked loader worker too, has closed it): the next `start_forkserver` starts another. It ends once
    no process holds that pipe; the processes it started go on. Reaps the servers abandoned before that ended."""
    server: Any = forkserver._forkserver
    with server._lock:
        if server._forkserver_pid is not None:
            os.close(server._forkserver_alive_fd)
            _abandoned.append(server._forkserver_pid)
            address = server._forkserver_address
            server._forkserver_alive_fd = server._forkserver_address = server._forkserver_pid = None
            if isinstance(address, str) and not address.startswith("\0"):  # a socket file, not an abstract name
                with contextlib.suppress(OSError):
                    os.unlink(address)
    for pid in list(_abandoned):
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == 0:
                continue
        _abandoned.remove(pid)


def protect_resource_tracker(signums: Iterable[int]) -> Callable[[], None]:
    """Until the returned function is called, this process's resource tracker, whenever it is (re)started, ignores
    ``signums`` (an ignored signal stays ignored through the new interpreter's ``exec``; the tracker itself ignores
    only SIGINT and SIGTERM) and leaves the calling thread's signal mask as it found it (CPython unblocks SIGINT and
    SIGTERM once it has started it). SLURM's requeue signal to the whole job killed the tracker; the next worker's
    launch started another inside the rank's block of the held signals (`readers.worker_starts`), which that
    unblocked, so the requeue's SIGTERM killed the worker then starting. Every launch of a worker not forked and
    every named semaphore goes through the tracker's ``ensure_running``: it is replaced on the tracker instance."""
    held = tuple(sorted(set(signums)))
    ignored = tuple(signum for signum in held if signum not in (signal.SIGINT, signal.SIGTERM))
    tracker: Any = resource_tracker._resource_tracker
    original = type(tracker).ensure_running

    def ensure_running() -> None:
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, held)  # arriving meanwhile, they wait (ignored or not)
        handlers: dict[int, Any] = {}
        flushed: set[int] = set()
        if threading.current_thread() is threading.main_thread():  # (Python sets handlers there only)
            flushed = signal.sigpending() & set(ignored)  # setting SIG_IGN discards a pending signal: sent again
            for signum in ignored:
                if signal.getsignal(signum) is not None:  # a handler not set from Python cannot be put back
                    handlers[signum] = signal.signal(signum, signal.SIG_IGN)
        try:
            original(tracker)
        finally:
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
            for signum in flushed:
                os.kill(os.getpid(), signum)  # pending again until the mask below lets it in
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    tracker.ensure_running = ensure_running

    def stop() -> None:
        tracker.__dict__.pop("ensure_running", None)

    return stop


def ensure_resource_tracker() -> None:
    """Start this process's resource tracker unless it runs, through `protect_resource_tracker`'s replacement while
    it is in place (``multiprocessing.resource_tracker.ensure_running`` is bound to the original)."""
    resource_tracker._resource_tracker.ensure_running()


def end_as_a_forked_process_ends() -> NoReturn:
    """In a process multiprocessing started (by spawn) whose target has returned: what ``BaseProcess._bootstrap`` does
    after the target (multiprocessing's finalizers, which flush its queues; the other threads joined; the streams
    flushed), then the exit a forked process makes (``os._exit``). Spawn's own exit goes through the interpreter's
    finalization, a collection of every object of torch and Lightning: seconds on a busy machine, while the rank
    waits for the worker (torch then stops waiting, and ends it)."""
    util._exit_function()  # type: ignore[attr-defined]
    threading._shutdown()  # type: ignore[attr-defined]
    util._flush_std_streams()  # type: ignore[attr-defined]
    os._exit(0)
