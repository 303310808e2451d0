"""Signals between a rank and the processes it forks: a rank records a preemption signal and acts on it
where every rank is in step (`DeferredSignals`, which `lightning_resumable.lightning.signals.HeldPreemption`
installs for a fit), and every process it forks meanwhile leaves such a signal to it
(`leave_signals_to_this_process`). Neither imports Lightning.

A cluster stops a job by signalling every process of it: SLURM signals each process of the job step,
``kill -- -PGID`` a process group, torchrun each rank's process group. Loader workers get the signal
with their rank. Torch's worker handler (installed by ``_worker_loop``) ends a worker on a SIGTERM that
does not come from its parent, so the rank then fails with "DataLoader worker ... is killed by signal"
(or hangs in a collective its peer left) instead of ending in step with the others. So, while a process
holds the signals, each process it forks (a torch ``DataLoader``'s workers of any loader, a data
library's, a validation loader's) ignores them: its holder ends it in order (shutting the loader down).
A loader worker still ends once its loader is shutting it down (torch's ``done_event`` is set: the
SIGTERM may be torch's ``terminate`` of a worker that did not exit in time), with status 0 as under
torch's handler; and any of them ends as it would without the library once its holder has gone or no
longer holds (at the interpreter's exit multiprocessing SIGTERMs daemon workers left running). The
holder says whether it holds through one shared byte (an anonymous shared mapping, made before any
fork, so every forked process sees its changes).
"""

from __future__ import annotations

import atexit
import contextlib
import mmap
import os
import signal
import tempfile
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from lightning_resumable.internals._torch import after_worker_signal_setup, is_set_without_locking

__all__ = [
    "DeferredSignals",
    "Handler",
    "LeftToHolder",
    "forked_by_server",
    "leave_signals_in_this_worker",
    "leave_signals_to_this_process",
    "map_record",
    "stop_leaving_signals",
]

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class DeferredSignals:
    """Record ``signums`` instead of handling them; `agree` on them across ranks at a point in step."""

    def __init__(self, signums: Iterable[int]) -> None:
        self.signums = tuple(sorted(set(signums)))
        self._received: set[int] = set()
        self._original: dict[int, Handler] = {}
        self._pid = os.getpid()

    def _record(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:  # a forked process before its after-fork hook (`LeftToHolder`): not its signal
            return
        self._received.add(signum)

    @property
    def installed(self) -> bool:
        return bool(self._original)

    @property
    def received(self) -> frozenset[int]:
        """The signals this process received since the last agreement."""
        return frozenset(self._received)

    def original(self, signum: int) -> Handler:
        """The handler that ``signum`` had before `install` (a user's own, or the default)."""
        return self._original.get(signum)

    def install(self) -> bool:
        """Take over the signals (main thread only: Python sets handlers there); ``False`` elsewhere."""
        if threading.current_thread() is not threading.main_thread():
            return False
        self._pid = os.getpid()
        for signum in self.signums:
            self._original[signum] = signal.getsignal(signum)
            signal.signal(signum, self._record)
        return True

    def uninstall(self) -> set[int]:
        """Put the original handlers back where this object's are still in place; the signals received and
        not yet agreed on."""
        for signum, handler in self._original.items():
            if getattr(signal.getsignal(signum), "__self__", None) is self:
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._original.clear()
        unhandled, self._received = self._received, set()
        return unhandled

    def agree(self, device: torch.device) -> set[int]:
        """The signals any rank received since the last agreement; collective (every rank calls it at
        the same point), a single all-reduce of one flag per signal."""
        # Swap the set before reading it: a signal handled between a read and a clear would be lost
        # (a handler runs between any two bytecodes), and its rank would never stop.
        received, self._received = self._received, set()
        if not (dist.is_available() and dist.is_initialized()):  # one process: no tensor (tens of µs a batch)
            return received & set(self.signums)
        flags = torch.tensor([signum in received for signum in self.signums], dtype=torch.int32, device=device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return {signum for signum, flag in zip(self.signums, flags.tolist(), strict=True) if flag}


# ---------------------------------------------------------------------- the processes a holder starts
_holding: mmap.mmap | None = None
"""The holding process's shared byte (1 while it holds): a one-byte file's shared mapping, inherited by every
process it forks and mapped by path in a process it starts otherwise (`leave_signals_in_this_worker`)."""
_holding_path = ""
_holder = 0
"""The pid of the process that made `_holding` (a forked process holding for itself makes its own)."""
_held: tuple[int, ...] = ()
_hook_installed = False
_arranged_in = 0
"""The pid of the process whose held signals are already left to its holder (a forked worker, by the at-fork
hook, before its worker loop does it again)."""
_forking = 0
"""The pid of the process that forks, taken before the fork: a child's parent, even where the parent has ended
before the child's at-fork hook runs (its ``getppid()`` is then init's)."""


def _record_prefix() -> str:
    """A holder's records are named by its pid namespace and pid, so a holder can tell the records of the
    holders that ended (`_remove_ended_holders_records`) from those of processes another namespace runs."""
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        namespace = 0
    return f"lightning-resumable-holder-{namespace}-"


def _remove_ended_holders_records(folder: str, prefix: str) -> None:
    """Remove the records of this namespace's holders that ended without their exit handlers (killed, as a
    scheduler kills after its grace period): a page of shared memory each, left otherwise until a reboot."""
    for name in os.listdir(folder):
        pid = name[len(prefix) :].split("-", 1)[0]
        if not (name.startswith(prefix) and pid.isdigit()):
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):  # another holder removed it first, or not ours to remove
                os.unlink(os.path.join(folder, name))
        except OSError:  # alive (another user's)
            continue


def _make_record() -> None:
    global _holding, _holding_path, _holder
    folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    prefix = _record_prefix()
    _remove_ended_holders_records(folder, prefix)
    descriptor, _holding_path = tempfile.mkstemp(prefix=f"{prefix}{os.getpid()}-", dir=folder)
    try:
        os.write(descriptor, b"\0")
        _holding = mmap.mmap(descriptor, 1)  # shared: every process that maps the file sees its changes
    finally:
        os.close(descriptor)
    _holder = os.getpid()
    atexit.register(_remove_record, _holding_path, _holder)


def _remove_record(path: str, holder: int) -> None:
    if os.getpid() == holder:  # not a forked process's exit
        with contextlib.suppress(OSError):
            os.unlink(path)


def leave_signals_to_this_process(signums: Iterable[int]) -> str:
    """From now until `stop_leaving_signals`, every process this one forks (and their own forks) ignores
    ``signums`` while this one lives and holds them; see the module's docstring. The path of the record
    that says whether this process holds (for a worker it starts without forking)."""
    global _held, _hook_installed
    if _holding is None or _holder != os.getpid():
        _make_record()
    assert _holding is not None
    _held = tuple(sorted(set(signums)))
    _holding[0] = 1
    if not _hook_installed:
        os.register_at_fork(before=_before_fork, after_in_child=_in_forked_child)
        _hook_installed = True
    return _holding_path


def stop_leaving_signals() -> None:
    """The processes started so far end on those signals again as they would without the library."""
    if _holding is not None and _holder == os.getpid():
        _holding[0] = 0


class LeftToHolder:
    """A started process's handler of the held signals: ignored while its parent lives and its holder holds
    them; else the signal's default action, as without the library. A loader worker whose loader is shutting
    it down exits at once, as torch's own handler makes it exit on its parent's ``terminate``: with status 0,
    which its rank, still watching its workers while it joins them, takes for a worker that ended (one killed
    by the signal there failed the rank with "DataLoader worker ... is killed by signal").

    ``parent``: the process whose life the holder's is (the holder, or the forkserver that forked this one,
    which ends with the holder). A process forked from this one has this handler until its own at-fork hook sets
    another (a forkserver's worker, the first instant after the server's fork): it leaves the signals while this
    one, its parent, lives, as its hook's handler will."""

    def __init__(self, holding: mmap.mmap, parent: int, signums: tuple[int, ...]) -> None:
        self.holding = holding
        self.parent = parent
        self.signums = signums
        self.set_in = os.getpid()
        self.loader_done: Any = None  # a torch worker's ``done_event``, once its loop started

    def install(self) -> None:
        for signum in self.signums:
            signal.signal(signum, self)

    def worker_started(self, done_event: Any) -> None:
        """In a torch loader worker, after torch set its own handlers: the held SIGTERM is left to the holder
        again, and the worker knows when its loader is being shut down."""
        self.loader_done = done_event
        if signal.SIGTERM in self.signums:
            signal.signal(signal.SIGTERM, self)

    def leaves(self) -> bool:
        parent = self.parent if os.getpid() == self.set_in else self.set_in
        return bool(self.holding[0]) and os.getppid() == parent

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.loader_done is not None and is_set_without_locking(self.loader_done):
            os._exit(0)
        if self.leaves():
            return
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _before_fork() -> None:
    global _forking
    _forking = os.getpid()


def _in_forked_child() -> None:
    """``os.register_at_fork``'s ``after_in_child``: a process forked while its parent holds leaves them to it (its
    parent by the pid taken before the fork: one that ended first leaves this one to end on the signal)."""
    global _arranged_in
    if _holding is None or not _holding[0] or not _held:
        return
    handler = LeftToHolder(_holding, _forking or os.getppid(), _held)
    handler.install()
    after_worker_signal_setup(handler.worker_started)
    _arranged_in = os.getpid()


def map_record(path: str) -> mmap.mmap:
    """The holder's record at ``path``, mapped read-only in a process it did not fork."""
    with open(path, "rb") as record:
        return mmap.mmap(record.fileno(), 1, prot=mmap.PROT_READ)


def forked_by_server(server: int) -> None:
    """In a process a forkserver forked (`lightning_resumable.readers.forkserver_signals`): its parent is
    ``server``, whose life is its holder's."""
    global _server_forked
    _server_forked = (os.getpid(), server)


_server_forked = (0, 0)
"""(A process a forkserver forked, that server's pid), set by `forked_by_server`."""


def leave_signals_in_this_worker(path: str, signums: tuple[int, ...], holder: int) -> bool:
    """In a loader worker its holder (pid ``holder``) started, before its worker loop: leave ``signums`` to the
    holder whose record is at ``path`` (nothing to do in a forked worker, which did it as it was forked). The
    signals a worker started by spawn was started with blocked are unblocked once torch's handlers are replaced.
    Whether the worker was forked by its holder.

    Its parent is the holder (spawn) or the holder's forkserver, by the pid handed to it, never ``getppid()``
    here: a worker whose parent ended before this runs would take init for its parent, and leave the signals
    to it (the record still says the holder holds) instead of ending on them."""
    if _arranged_in == os.getpid():
        return True
    process, server = _server_forked
    handler = LeftToHolder(map_record(path), server if process == os.getpid() else holder, signums)
    handler.install()
    after_worker_signal_setup(handler.worker_started, unblock=signums)
    return False
