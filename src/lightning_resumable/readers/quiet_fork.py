"""Forking loader workers only at a moment when no native thread of the process is running.

On an affected CPython (`lightning_resumable.readers.workers`), a fork deadlocks the child when
another thread holds the runtime's ``HEAD_LOCK``. Python threads take it when they start or end (the
library joins its own first); a native thread takes it when it enters Python for the first time,
``PyGILState_Ensure`` creating its thread state before it waits for the GIL. A DDP process with the
gloo backend has such threads: after a collective, gloo's ``pt_gloo_runloop`` thread drops the
finished work, and with it the last reference to a tensor that Python had already let go of (the
temporaries of ``all_gather_object``, ``broadcast_object_list``), whose Python object it then frees
under the GIL. Measured on this project's 3.11.7 (`benchmarks/fork_after_collective.py`): 2 gloo
ranks, each round an ``all_gather_object`` and then a fork: 18 children deadlocked in 40,000 forks,
none with the wait below.

So, right before each fork of the library's loaders, and during a fit with the callback before every
fork of the process (a validation loader's workers too: an ``os.register_at_fork`` hook, active
inside `guarded_forks` and between `start_guarding` and `stop_guarding`), the forking thread waits until every native
thread, that is every thread that is not a Python thread, is asleep or stopped (about 0.15 ms to look
at 4 threads). None is then between creating a thread state and waiting for the GIL, and none is
woken before the fork: only this thread gives gloo's threads work, and it holds the GIL from its last
look to the fork (but for a hand-over of the GIL in the few instructions between them). The wait
yields the GIL so that a native thread waiting for it finishes; it is bounded, and a thread that keeps
running past the bound (a spinning thread pool, a user's busy native thread) is named in a warning
and the fork goes ahead.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = [
    "FORK_DEADLOCK_FIXED_IN",
    "QUIET_WAIT_S",
    "ForkGuard",
    "affected_python",
    "guarded_forks",
    "running_native_threads",
    "start_guarding",
    "stop_guarding",
]

FORK_DEADLOCK_FIXED_IN = (3, 11, 10)
"""The first CPython 3.11 release with the fix of gh-112275 (3.12 and later never had the bug)."""
QUIET_WAIT_S = 1.0
"""How long a fork waits for the native threads to sleep: gloo's threads settle within microseconds
of their work, an OpenMP pool's within its spin count (a fraction of a millisecond by default)."""
_TASKS = Path("/proc/self/task")
_RUNNING = frozenset({"R", "D"})
"""The states of a thread that may hold a lock now: running or runnable, or in an uninterruptible wait."""

_guarding = 0
_installed = False
_warned = False


def affected_python() -> bool:
    """Whether this CPython can deadlock a forked child on another thread's ``HEAD_LOCK`` (gh-112275)."""
    return sys.version_info[:3] < FORK_DEADLOCK_FIXED_IN


def running_native_threads() -> list[str]:
    """The native threads of this process (not Python threads, not the caller) that are running now,
    as ``"name (tid)"``; ``[]`` where ``/proc`` does not tell."""
    python = {thread.native_id for thread in threading.enumerate()}
    me = threading.get_native_id()
    running = []
    try:
        tasks = os.listdir(_TASKS)
    except OSError:
        return []
    for task in tasks:
        tid = int(task)
        if tid == me or tid in python:
            continue
        try:
            stat = (_TASKS / task / "stat").read_text()
        except OSError:  # ended meanwhile
            continue
        name_end = stat.rindex(")")  # "tid (name) state ...": the name may hold spaces and parentheses
        if stat[name_end + 2] in _RUNNING:
            running.append(f"{stat[stat.index('(') + 1 : name_end]} ({tid})")
    return running


def _wait_for_quiet_native_threads() -> None:
    """``os.register_at_fork``'s ``before`` hook: inside `guarded_forks`, wait until no native thread runs."""
    global _warned
    if not _guarding:
        return
    deadline = time.monotonic() + QUIET_WAIT_S
    while running := running_native_threads():
        if time.monotonic() >= deadline:
            if not _warned:
                _warned = True
                warnings.warn(
                    f"lightning_resumable: native threads {running} kept running for {QUIET_WAIT_S} s before a loader"
                    " forked its workers; the fork went ahead, and on this CPython (gh-112275) a worker can deadlock"
                    " if one of them was entering Python at that moment",
                    RuntimeWarning,
                    stacklevel=2,
                )
            return
        os.sched_yield()  # releases the GIL: a native thread waiting for it finishes and goes back to sleep


def start_guarding() -> None:
    """Every ``os.fork`` of the process from now on first waits for the native threads to sleep (on an
    affected CPython), until the matching `stop_guarding`. Installs the hook once per process."""
    global _guarding, _installed
    if not affected_python():
        return
    if not _installed and sys.platform == "linux":
        os.register_at_fork(before=_wait_for_quiet_native_threads)
        _installed = True
    _guarding += 1


def stop_guarding() -> None:
    """End one `start_guarding`: the hook does nothing once every one has ended."""
    global _guarding
    if affected_python():
        _guarding = max(_guarding - 1, 0)


class ForkGuard:
    """One holder's guard on every fork of the process (a fit's, held by the callback): started at most
    once, stopped at most once, whatever the order of the hooks that call it."""

    def __init__(self) -> None:
        self.on = False

    def start(self) -> None:
        if not self.on:
            start_guarding()
            self.on = True

    def stop(self) -> None:
        if self.on:
            stop_guarding()
            self.on = False


@contextmanager
def guarded_forks() -> Iterator[None]:
    """Every ``os.fork`` inside the block (a loader forking its workers) first waits for the native
    threads to sleep (`start_guarding`)."""
    start_guarding()
    try:
        yield
    finally:
        stop_guarding()
