"""Preemption signals held from the callback's setup to the fit's end and acted on where every rank is in step.

Lightning 2.6 handles SIGTERM and SLURM's requeue signal inside the signal handler: its SIGTERM
handler broadcasts to the other ranks, its requeue handler saves a checkpoint (a barrier). A handler
runs wherever the main thread happens to be, so ranks enter those collectives at different points
(one in the backward's allreduce, another in a broadcast) and wait forever: 7 of 7 runs hung with
SIGTERM sent to every rank. And a rank that receives SIGTERM twice (from the scheduler and from rank
0, which forwards it) nests two broadcasts.

`HeldPreemption` holds those signals from the callback's ``setup`` (before the checkpoint's restore,
the sanity check and the first loaders' workers) until Lightning's own teardown of its signal handling
(after the exception path's save and the loaders' shutdown): a handler only records the signal, and
Lightning sets none of its own meanwhile. At the train start and at the end of each training batch,
where every rank is in step, the ranks agree in one small all-reduce on what any of them received, and
all act on it at the same step. Every process a rank forks meanwhile, and every loader worker it starts
by forkserver or spawn (of any loader), leaves the signals to its rank
(`lightning_resumable.readers.worker_signals`, `lightning_resumable.readers.worker_starts`), so a signal
to the whole process group ends no worker under its rank.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info

from lightning_resumable.internals._lightning_signals import (
    end_fit_before_training,
    give_signals_back_to_lightning,
    handle_preemption_signal,
    keep_lightning_from_signals,
    preemption_signals,
)
from lightning_resumable.readers.worker_signals import (
    DeferredSignals,
    leave_signals_to_this_process,
    stop_leaving_signals,
)
from lightning_resumable.readers.worker_starts import leave_signals_to_workers, stop_leaving_signals_to_workers

__all__ = ["HeldPreemption"]


class HeldPreemption:
    """Lightning's preemption signals, held from the callback's setup to the fit's end and acted on at the
    train start or at the end of a batch, on every rank at once (`DeferredSignals`; what acting means:
    `lightning_resumable.internals._lightning.handle_preemption_signal`).

    A signal received before the train loop (setup, restore, sanity check) is acted on at the train start:
    SIGTERM ends the fit there, before its first batch. Inside a gradient accumulation window the ranks
    agree on a signal at once but act on it at the window's end (at most ``accumulate_grad_batches - 1``
    batches later), where a checkpoint resumes exactly. Before acting on SIGTERM the ranks capture the
    complete data state together (every rank's stream state and next-batch digest), which the save from the
    exception path then writes without any collective. Signals that arrive once the fit is ending (a
    second SIGTERM, SLURM's requeue signal repeated) change nothing: the checkpoint is written whole and
    the processes exit as the first signal asked.
    """

    def __init__(self) -> None:
        self._signals: DeferredSignals | None = None
        self._trainer: pl.Trainer | None = None
        self._agreed: set[int] = set()  # agreed on, held for the end of the accumulation window
        self._received_here: set[int] = set()
        self._held = 0  # batches a signal has been held for
        self._ending = False  # the ranks acted on SIGTERM: the fit is ending
        self._capture: Callable[[], None] | None = None

    def hold(self, trainer: pl.Trainer, capture: Callable[[], None]) -> None:
        """From the callback's setup of a fit: record the signals, keep Lightning's handlers off them, and let
        every process forked from now on leave them to this one. ``capture`` takes the data state, collectively,
        where the ranks act on SIGTERM."""
        self.release()  # a fit that ended without Lightning's teardown (a test driving hooks by hand)
        signals = DeferredSignals(preemption_signals(trainer))
        if not signals.install():  # not the main thread: Lightning cannot set its handlers either
            return
        self._signals, self._trainer, self._ending, self._capture = signals, trainer, False, capture
        leave_signals_to_workers(leave_signals_to_this_process(signals.signums), signals.signums)
        keep_lightning_from_signals(trainer, signals.signums, self.release)

    def act(self, trainer: pl.Trainer, at_boundary: bool, before_training: bool = False) -> None:
        """At the train start (``before_training``) or at the end of a training batch, where every rank is
        (collective when held); ``at_boundary``: the batch ended an accumulation window."""
        if self._signals is None or self._ending:
            return
        self._received_here |= self._signals.received
        self._agreed |= self._signals.agree(trainer.strategy.root_device)
        if not self._agreed:
            return
        if not at_boundary:
            if not self._held:
                rank_zero_info(
                    "lightning_resumable: a preemption signal is held until the end of the gradient accumulation"
                    f" window (accumulate_grad_batches={trainer.accumulate_grad_batches}), where a checkpoint resumes"
                    " exactly"
                )
            self._held += 1
            return
        if self._held:
            rank_zero_info(f"lightning_resumable: the preemption signal was held for {self._held} batch(es)")
        agreed, received_here = sorted(self._agreed), self._received_here
        self._agreed, self._received_here, self._held = set(), set(), 0
        if signal.SIGTERM in agreed:
            if self._capture is not None:
                self._capture()
            self._ending = True
        for signum in agreed:
            handle_preemption_signal(trainer, signum, signum in received_here, self._signals.original(signum))
        if self._ending and before_training:
            end_fit_before_training()

    def release(self) -> None:
        """Give the signals back (Lightning's teardown calls it once its own handlers are restored): a signal
        received after the last batch only marks a SIGTERM (the fit is ending: no rank waits for the others
        any more); one received once the fit was ending, or before an exception ended it, is only reported."""
        signals, trainer = self._signals, self._trainer
        self._signals, self._trainer = None, None
        if signals is None or trainer is None:
            return
        give_signals_back_to_lightning(trainer)
        stop_leaving_signals()
        stop_leaving_signals_to_workers()
        for signum in sorted(signals.uninstall() | self._agreed):
            if self._ending:
                rank_zero_info(f"signal {signum} arrived while the fit was ending; it changed nothing")
                continue
            if trainer.interrupted:  # an exception ended the fit before the ranks reached a point to act on it
                rank_zero_info(f"signal {signum} arrived before the fit ended by an exception; it changed nothing")
                continue
            rank_zero_info(f"signal {signum} arrived after the last training batch; the fit ends as it would")
            if signum == signal.SIGTERM:
                handle_preemption_signal(trainer, signum, True, signals.original(signum))
        self._agreed, self._received_here, self._held = set(), set(), 0
