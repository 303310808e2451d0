"""Loader workers that are not forked leave the held signals to their rank too.

A worker started by ``spawn`` is a new interpreter, one started by ``forkserver`` (Python 3.14's default,
which torch's ``DataLoader`` follows) a fork of a server process the rank started: neither runs the
rank's ``os.register_at_fork`` hook (`lightning_resumable.readers.worker_signals`), and a SIGTERM sent to
the whole job while it starts, or once torch set its handler, ends it, and its rank fails with "DataLoader
worker ... exited unexpectedly". What every worker of a torch (or torchdata) loader runs, whatever its
start method, is the worker loop its iterator gives it as its target: while a rank holds, that target is
`LeavingWorkerLoop` (pickled for a worker that is not forked), which leaves the signals to the rank before
the loop starts. Until it runs, the start method decides:

- fork: the at-fork hook has already done it.
- spawn: the rank starts the worker with the held signals blocked (a signal mask is inherited through the
  new interpreter's ``exec``), so one sent meanwhile waits and reaches the worker's handler once it is set.
  CPython starts its resource tracker the same way, and then unblocks SIGTERM: the tracker is started first,
  and, while the rank holds, any tracker started again (SLURM's requeue signal killed the one running) keeps the
  rank's mask and ignores the held signals (`internals._multiprocessing.protect_resource_tracker`).
- once its loop has ended, a worker that was not forked goes through the interpreter's finalization, which
  puts the default handlers back: the held signals are blocked from then on (a forked worker ends at once).
- forkserver: the server (which the group's signal would end too, and with it every later worker start)
  is started by the rank with the signals blocked and imports `lightning_resumable.readers.forkserver_signals`,
  which makes it, and every process it forks, leave them to the rank. A server started before the hold (a
  loader iterated before the fit) is let go (it ends once no process holds its pipe; what it started goes
  on) and another one started so.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterator
from multiprocessing.reduction import ForkingPickler
from typing import Any

from torch.utils.data import DataLoader

from lightning_resumable.errors import UnsupportedLoaderError
from lightning_resumable.internals._multiprocessing import (
    abandon_forkserver,
    end_as_a_forked_process_ends,
    ensure_resource_tracker,
    forkserver_pid,
    forkserver_preload,
    protect_resource_tracker,
    start_forkserver,
)
from lightning_resumable.internals._torch import guard_worker_starts, replace_worker_loops
from lightning_resumable.readers.worker_signals import leave_signals_in_this_worker

__all__ = [
    "FORKSERVER_MODULE",
    "HOLDER_VARIABLE",
    "LeavingWorkerLoop",
    "leave_signals_to_workers",
    "refuse_unpicklable",
    "start_method",
]

FORKSERVER_MODULE = "lightning_resumable.readers.forkserver_signals"
HOLDER_VARIABLE = "LIGHTNING_RESUMABLE_SIGNAL_HOLDER"
"""Set while the rank starts its forkserver: ``<rank's pid>:<record path>:<signal>,<signal>...``."""


def start_method(loader: DataLoader[Any]) -> str:
    """How ``loader``'s workers start: its ``multiprocessing_context``'s method, else the process default."""
    context = loader.multiprocessing_context
    method: str = context.get_start_method() if context is not None else multiprocessing.get_start_method()
    return method


def refuse_unpicklable(loader: DataLoader[Any], which: str) -> None:
    """Before any step: what torch pickles for each worker of ``loader`` (``which`` names it) that is not forked
    (its dataset, ``collate_fn`` and ``worker_init_fn``), pickled once here.

    Raises:
        UnsupportedLoaderError: one of them cannot be pickled; the message names it and pickle's reason.
    """
    method = start_method(loader) if loader.num_workers > 0 else "fork"
    if method == "fork":
        return
    for name in ("dataset", "collate_fn", "worker_init_fn"):
        value = getattr(loader, name)
        try:
            ForkingPickler.dumps(value)
        except Exception as error:
            raise UnsupportedLoaderError(
                f"{which}'s workers start by {method}, which pickles its {name} ({type(value).__name__}) for each"
                f" worker, and it cannot be pickled: {type(error).__name__}: {error}. Define what it holds at a"
                " module's top level (a class or function defined inside another function cannot be pickled), or"
                " start its workers by fork (multiprocessing_context='fork')"
            ) from error


class LeavingWorkerLoop:
    """A loader worker's target while its rank (pid ``holder``) holds: leaves ``signums`` to the rank, then runs
    ``loop``."""

    def __init__(self, loop: Callable[..., Any], record: str, signums: tuple[int, ...], holder: int) -> None:
        self.loop, self.record, self.signums, self.holder = loop, record, signums, holder

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        forked = leave_signals_in_this_worker(self.record, self.signums, self.holder)
        try:
            ended = self.loop(*args, **kwargs)
        finally:
            # The loop has ended: the worker only exits now. One not forked exits through the interpreter's
            # finalization, which puts the default handlers back (a signal then would kill it while its rank still
            # watches it): the signals wait, and end with the process.
            signal.pthread_sigmask(signal.SIG_BLOCK, self.signums)
        if not forked:  # without the interpreter's finalization (seconds), as a forked worker ends
            end_as_a_forked_process_ends()
        return ended

    def __reduce__(self) -> tuple[Any, ...]:
        module, name = getattr(self.loop, "__module__", None), getattr(self.loop, "__qualname__", None)
        if module and name and _named(module, name) is not self.loop:  # its name is this object's on the rank
            return _leaving_worker_loop, (module, name, self.record, self.signums, self.holder)
        return LeavingWorkerLoop, (self.loop, self.record, self.signums, self.holder)  # as itself (a partial, a class)


def _named(module: str, name: str) -> Any:
    found: Any = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part, None)
    return found


def _leaving_worker_loop(
    module: str, name: str, record: str, signums: tuple[int, ...], holder: int
) -> LeavingWorkerLoop:
    """In a worker not forked: its loop is what its name holds there (the rank's replacement is not there)."""
    return LeavingWorkerLoop(_named(module, name), record, signums, holder)


_stop: list[Callable[[], None]] = []
_forkserver: tuple[int, str] | None = None
"""The forkserver this process started holding (its pid, and the holder it was started for)."""


def leave_signals_to_workers(record: str, signums: tuple[int, ...]) -> None:
    """From now until `stop_leaving_signals_to_workers`, every torch loader worker started leaves ``signums``
    to this process (whose record of holding is at ``record``), whatever its start method."""
    stop_leaving_signals_to_workers()
    holder = f"{os.getpid()}:{record}:{','.join(str(signum) for signum in signums)}"

    @contextlib.contextmanager
    def starting_workers(loader: DataLoader[Any]) -> Iterator[None]:
        method = start_method(loader) if loader.num_workers > 0 else "none"
        if method == "forkserver":
            _ensure_forkserver(holder, signums)
        if method == "spawn":  # started first: as it starts its tracker, multiprocessing unblocks SIGTERM
            ensure_resource_tracker()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, signums) if method == "spawn" else None
        try:
            yield
        finally:
            if blocked is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    _stop.append(protect_resource_tracker(signums))
    rank = os.getpid()
    _stop.append(replace_worker_loops(lambda loop: LeavingWorkerLoop(loop, record, signums, rank)))
    _stop.append(guard_worker_starts(starting_workers))


def stop_leaving_signals_to_workers() -> None:
    """Workers started from now on run their own loop again."""
    while _stop:
        _stop.pop()()


def _ensure_forkserver(holder: str, signums: tuple[int, ...]) -> None:
    """This process's forkserver, started for ``holder`` (see the module's docstring) unless one runs."""
    global _forkserver
    running = forkserver_pid()
    if running is not None and _forkserver == (running, holder) and _is_alive(running):
        return
    if running is not None:  # started before the hold (a loader iterated before the fit), or for another one
        abandon_forkserver()
    modules = forkserver_preload()
    if FORKSERVER_MODULE not in modules:
        multiprocessing.set_forkserver_preload([*modules, FORKSERVER_MODULE])
    previous = os.environ.get(HOLDER_VARIABLE)
    os.environ[HOLDER_VARIABLE] = holder
    ensure_resource_tracker()  # (the forkserver's start starts it, and then unblocks SIGTERM)
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, signums)
    try:
        _forkserver = (start_forkserver(), holder)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        if previous is None:
            del os.environ[HOLDER_VARIABLE]
        else:
            os.environ[HOLDER_VARIABLE] = previous


def _is_alive(pid: int) -> bool:
    """Whether child ``pid`` has not ended (read without reaping it: multiprocessing reaps its server)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
        return False
