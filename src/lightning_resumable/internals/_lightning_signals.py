"""Lightning's handling of preemption signals, as the library holds and hands it on: which signals Lightning
handles in a fit (`preemption_signals`), what its handler does, done where every rank is in step
(`handle_preemption_signal`, `end_fit_before_training`), and its signal connector kept from setting handlers
while the library holds the signals (`keep_lightning_from_signals`, `give_signals_back_to_lightning`).

Checked against lightning 2.6.6 by ``tests/test_lightning_internals.py``, as `_lightning` is.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.plugins.environments.slurm import SLURMEnvironment

__all__ = [
    "end_fit_before_training",
    "give_signals_back_to_lightning",
    "handle_preemption_signal",
    "keep_lightning_from_signals",
    "preemption_signals",
]

log = logging.getLogger("lightning.pytorch.lightning_resumable")


def preemption_signals(trainer: pl.Trainer) -> tuple[int, ...]:
    """The signals Lightning handles during a fit: SIGTERM, and SLURM's requeue signal when the cluster
    environment is a ``SLURMEnvironment`` with ``auto_requeue`` and the signal has no handler yet
    (``_SignalConnector.register_signal_handlers`` leaves one it finds in place)."""
    signums = [signal.SIGTERM]
    environment = trainer._accelerator_connector.cluster_environment
    slurm = environment if isinstance(environment, SLURMEnvironment) else None
    requeue = slurm.requeue_signal if slurm is not None and slurm.auto_requeue else None
    if requeue and signal.getsignal(requeue) in (None, signal.SIG_DFL):
        signums.append(requeue)
    return tuple(int(signum) for signum in signums)


def handle_preemption_signal(trainer: pl.Trainer, signum: int, received_here: bool, original: object) -> None:
    """Do what Lightning's handler for ``signum`` does, where every rank is in step (all ranks call this
    at the same point), without its collectives inside a handler.

    - SIGTERM: mark it received (``_SignalConnector.received_sigterm``); the training epoch loop then
      raises ``SIGTERMException`` at the end of this batch on every rank, and ``on_exception`` runs
      (``OnExceptionCheckpoint`` saves there). Lightning's notifier would also broadcast and forward the
      signal to the ranks it launched: every rank already knows. A handler of the user's that was in place
      before the fit (``original``, which Lightning composes with its own) runs on the ranks that received
      the signal.
    - SLURM's requeue signal: Lightning's ``_slurm_sigusr_handler_fn`` on every rank: an HPC checkpoint
      (``hpc_ckpt_<n>.ckpt``, collective, so in step) and, on rank 0, ``scontrol requeue``.
    """
    connector = trainer._signal_connector
    if signum != signal.SIGTERM:
        connector._slurm_sigusr_handler_fn(signum, None)  # type: ignore[arg-type]
        return
    source = "received here" if received_here else "received by another rank"
    log.info(
        f"[rank: {trainer.global_rank}] lightning_resumable: SIGTERM {source}; every rank ends the fit after this batch"
    )
    connector.received_sigterm = True
    if received_here and callable(original):
        user_handler: Callable[..., Any] = original
        user_handler(signum, None)


def end_fit_before_training() -> None:
    """End the fit with Lightning's ``SIGTERMException`` before its first batch (from ``on_train_start``): the
    exception Lightning's loops raise after a batch once ``received_sigterm`` is set, so ``on_exception`` runs
    (``OnExceptionCheckpoint`` saves there) and ``fit()`` raises it."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    raise SIGTERMException


def keep_lightning_from_signals(trainer: pl.Trainer, signums: tuple[int, ...], at_teardown: Callable[[], None]) -> None:
    """From now until `give_signals_back_to_lightning`, Lightning's signal connector sets no handler of
    ``signums`` (``register_signal_handlers`` after the restore, ``teardown`` putting back what it found),
    and its ``teardown`` (the last step of ``Trainer._teardown``, on every path out of a fit, after the
    loops' teardown ended their loaders' workers) calls ``at_teardown`` once it has run.

    Lightning sets its handlers (which broadcast and save inside the handler) only after ``setup``, the
    restore and ``on_fit_start``; the library holds the signals from its ``setup`` on. The connector's
    ``_register_signal`` and ``teardown`` are replaced on this trainer's instance alone."""
    connector = trainer._signal_connector
    connector._register_signal = _SkippingHeld(type(connector)._register_signal, signums)  # type: ignore[method-assign]
    connector.teardown = _ThenCall(connector, at_teardown)  # type: ignore[method-assign]


def give_signals_back_to_lightning(trainer: pl.Trainer) -> None:
    """Undo `keep_lightning_from_signals` (nothing to do if it was not done)."""
    for name in ("_register_signal", "teardown"):
        trainer._signal_connector.__dict__.pop(name, None)


class _SkippingHeld:
    """Lightning's ``_register_signal`` for every signal but the held ones."""

    def __init__(self, register: Callable[[int, Any], None], signums: tuple[int, ...]) -> None:
        self.register, self.signums = register, signums

    def __call__(self, signum: int, handlers: Any) -> None:
        if int(signum) not in self.signums:
            self.register(signum, handlers)

    def __reduce__(self) -> tuple[Any, ...]:  # a trainer pickled mid-fit gets Lightning's own back
        from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector

        return getattr, (_SignalConnector, "_register_signal")


class _ThenCall:
    """A connector's ``teardown``, then ``after()``, once."""

    def __init__(self, connector: Any, after: Callable[[], None]) -> None:
        self.connector, self.after = connector, after

    def __call__(self) -> None:
        try:
            type(self.connector).teardown(self.connector)
        finally:
            give_signals_back_to_lightning(self.connector.trainer)
            self.after()

    def __reduce__(self) -> tuple[Any, ...]:  # a trainer pickled mid-fit gets Lightning's own back (bound when read)
        return getattr, (self.connector, "teardown")
