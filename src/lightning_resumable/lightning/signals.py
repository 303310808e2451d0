"""Signals handled where every rank is in step, not inside the handler.

Lightning 2.6 handles SIGTERM and SLURM's requeue signal inside the signal handler: its SIGTERM
handler broadcasts to the other ranks, its requeue handler saves a checkpoint (a barrier). A handler
runs wherever the main thread happens to be, so ranks enter those collectives at different points
(one in the backward's allreduce, another in a broadcast) and wait forever: 7 of 7 runs hung with
SIGTERM sent to every rank. And a rank that receives SIGTERM twice (from the scheduler and from rank
0, which forwards it) nests two broadcasts.

`DeferredSignals` replaces those handlers while the train loop runs: a handler only records the
signal. At the end of each training batch, where every rank is in step, the ranks agree in one small
all-reduce on what any of them received, and all act on it at the same step. A worker process forked
meanwhile inherits the recording handler: there it lets the first signal pass and puts the default
back, so a SIGTERM to the whole process group leaves the loader workers to their rank (which retires
them), while a second one (torch's ``terminate`` of a stuck worker) still ends the worker. Torch
installs its own SIGTERM handler when a worker starts (one that ends the worker on a signal not from
its parent, so that its rank then fails with "worker killed by signal"); `LeaveSigtermToRank`, the
worker_init_fn of the loaders the library builds, hands SIGTERM back to the inherited handler.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info

from lightning_resumable.internals._lightning import handle_preemption_signal, preemption_signals
from lightning_resumable.readers.worker_signals import DeferredSignals

__all__ = ["HeldPreemption"]


class HeldPreemption:
    """Lightning's preemption signals, held from the train start to its end under DDP and acted on at
    the end of a batch, on every rank at once (`DeferredSignals`; what acting means: `_lightning`).

    Inside a gradient accumulation window the ranks agree on a signal at once but act on it at the
    window's end (at most ``accumulate_grad_batches - 1`` batches later), where a checkpoint resumes
    exactly. Before acting they capture the complete data state together (every rank's stream state and
    next-batch digest), which the save from the exception path then writes without any collective.
    """

    def __init__(self) -> None:
        self._signals: DeferredSignals | None = None
        self._agreed: set[int] = set()  # agreed on, held for the end of the accumulation window
        self._received_here: set[int] = set()
        self._held = 0  # batches a signal has been held for

    def hold(self, trainer: pl.Trainer) -> None:
        if trainer.world_size > 1 and self._signals is None:
            signals = DeferredSignals(preemption_signals(trainer))
            if signals.install():
                self._signals = signals

    def act(self, trainer: pl.Trainer, at_boundary: bool, capture: Callable[[], None]) -> None:
        """At the end of a training batch, where every rank is (collective when held); ``at_boundary``: the
        batch ended an accumulation window; ``capture``: takes the data state, collectively, before acting."""
        if self._signals is None:
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
        capture()
        for signum in agreed:
            handle_preemption_signal(trainer, signum, signum in received_here, self._signals.previous(signum))

    def release(self, trainer: pl.Trainer) -> None:
        """Give the signals back to Lightning; one received after the last batch, or held in a window the
        fit ended in, only marks a SIGTERM (the fit is ending: no rank waits for the others any more)."""
        if self._signals is None:
            return
        signals, self._signals = self._signals, None
        for signum in sorted(signals.uninstall() | self._agreed):
            rank_zero_info(f"signal {signum} arrived after the last training batch; the fit ends as it would")
            if signum == signal.SIGTERM:
                handle_preemption_signal(trainer, signum, True, signals.previous(signum))
        self._agreed, self._received_here, self._held = set(), set(), 0
