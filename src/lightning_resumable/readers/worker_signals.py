"""Signals between a rank and its loader workers: a rank records a signal and acts on it where every
rank is in step (`DeferredSignals`, which `lightning_resumable.lightning.signals.HeldPreemption`
installs during a fit), and a worker forked meanwhile leaves SIGTERM to its rank (`LeaveSigtermToRank`,
the ``worker_init_fn`` of the loaders the library builds). Neither imports Lightning."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["DeferredSignals", "Handler", "LeaveSigtermToRank"]

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class DeferredSignals:
    """Record ``signums`` instead of handling them; `agree` on them across ranks at a point in step."""

    def __init__(self, signums: Iterable[int]) -> None:
        self.signums = tuple(sorted(set(signums)))
        self._received: set[int] = set()
        self._previous: dict[int, Handler] = {}
        self._pid = os.getpid()

    def _record(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:  # a forked loader worker: its rank decides, not the worker
            signal.signal(signum, signal.SIG_DFL)
            return
        self._received.add(signum)

    @property
    def installed(self) -> bool:
        return bool(self._previous)

    @property
    def received(self) -> frozenset[int]:
        """The signals this process received since the last agreement."""
        return frozenset(self._received)

    def previous(self, signum: int) -> Handler:
        """The handler that ``signum`` had before `install` (Lightning's, during a fit)."""
        return self._previous.get(signum)

    def install(self) -> bool:
        """Take over the signals (main thread only: Python sets handlers there); ``False`` elsewhere."""
        if threading.current_thread() is not threading.main_thread():
            return False
        self._pid = os.getpid()
        for signum in self.signums:
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._record)
        return True

    def uninstall(self) -> set[int]:
        """Put the previous handlers back; the signals received and not yet agreed on."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()
        unhandled, self._received = self._received, set()
        return unhandled

    def agree(self, device: torch.device) -> set[int]:
        """The signals any rank received since the last agreement; collective (every rank calls it at
        the same point), a single all-reduce of one flag per signal."""
        # Swap the set before reading it: a signal handled between a read and a clear would be lost
        # (a handler runs between any two bytecodes), and its rank would never stop.
        received, self._received = self._received, set()
        flags = torch.tensor([signum in received for signum in self.signums], dtype=torch.int32, device=device)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return {signum for signum, flag in zip(self.signums, flags.tolist(), strict=True) if flag}


class LeaveSigtermToRank:
    """A loader's ``worker_init_fn``, wrapping the user's: in a worker whose rank holds SIGTERM (its
    inherited handler is a `DeferredSignals` one), SIGTERM goes back to that handler, which lets the
    first pass; then the user's function runs. Picklable when the user's function is."""

    def __init__(self, user: Callable[[int], Any] | None) -> None:
        self.user = user

    def __call__(self, worker_id: int) -> None:
        inherited = signal.getsignal(signal.SIGTERM)  # Python's table: torch set its handler in C
        if isinstance(getattr(inherited, "__self__", None), DeferredSignals):
            signal.signal(signal.SIGTERM, inherited)
        if self.user is not None:
            self.user(worker_id)
