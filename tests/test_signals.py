"""`DeferredSignals`: a signal is recorded, not handled, until the ranks agree on it; the previous
handlers come back; a forked loader worker lets the first signal pass and dies of the second."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
import torch

from lightning_resumable.readers.worker_signals import DeferredSignals


def test_a_signal_is_recorded_then_agreed_on_once_and_the_previous_handler_comes_back() -> None:
    handled: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: handled.append(signum))
    try:
        signals = DeferredSignals([signal.SIGUSR1, signal.SIGTERM])
        assert signals.install() and signals.installed
        os.kill(os.getpid(), signal.SIGUSR1)
        assert handled == [] and signals.received == {signal.SIGUSR1}
        assert signals.agree(torch.device("cpu")) == {signal.SIGUSR1}  # one process: no collective
        assert signals.agree(torch.device("cpu")) == set()  # agreed once, not again
        os.kill(os.getpid(), signal.SIGTERM)  # recorded: this test process lives on
        assert signals.uninstall() == {signal.SIGTERM}  # received, never agreed on
        assert not signals.installed
        os.kill(os.getpid(), signal.SIGUSR1)
        assert handled == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_forked_worker_survives_the_first_signal_and_dies_of_the_second() -> None:
    signals = DeferredSignals([signal.SIGTERM])
    assert signals.install()
    try:
        ready, handled = os.pipe(), os.pipe()
        child = os.fork()
        if child == 0:  # the worker: ready; once the first SIGTERM is handled, says so; then waits
            os.write(ready[1], b"r")
            while signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
                signal.sigtimedwait([], 0.01)  # lets the handler run; returns after 10 ms
            os.write(handled[1], b"h")
            signal.pause()
            os._exit(3)
        os.close(ready[1])
        os.close(handled[1])  # a dead child closes the pipe: the reads below return b"" and fail
        assert os.read(ready[0], 1) == b"r"
        os.kill(child, signal.SIGTERM)
        assert os.read(handled[0], 1) == b"h"  # alive after the first
        os.kill(child, signal.SIGTERM)
        _, status = os.waitpid(child, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
        assert signals.received == frozenset()  # a worker's signal is not the rank's
    finally:
        signals.uninstall()


def run_worker_and_signal_it_twice(init: bool) -> tuple[bool, int]:
    """Fork a worker as torch starts one (its own SIGTERM handler), optionally run `LeaveSigtermToRank`;
    signal it once, from another process than its parent (as a scheduler does): whether it survived;
    then again: the signal that ended it."""
    from torch.utils.data._utils.signal_handling import _set_worker_signal_handlers

    from lightning_resumable.readers.worker_signals import LeaveSigtermToRank

    ready, handled = os.pipe(), os.pipe()
    child = os.fork()
    if child == 0:
        _set_worker_signal_handlers()  # what torch's _worker_loop does first
        if init:
            LeaveSigtermToRank(None)(0)
        os.write(ready[1], b"r")
        while signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            signal.sigtimedwait([], 0.01)
        os.write(handled[1], b"h")
        signal.pause()
        os._exit(3)
    os.close(ready[1])
    os.close(handled[1])
    assert os.read(ready[0], 1) == b"r"
    scheduler = ["kill", "-s", "TERM", str(child)]  # torch's handler exits quietly on its parent's SIGTERM
    subprocess.run(scheduler, check=True)
    survived = os.read(handled[0], 1) == b"h"
    if survived:
        subprocess.run(scheduler, check=True)
    _, status = os.waitpid(child, 0)
    return survived, os.WTERMSIG(status) if os.WIFSIGNALED(status) else -os.WEXITSTATUS(status)


def test_a_loader_worker_leaves_a_group_sigterm_to_its_rank_while_the_rank_holds_it() -> None:
    """Torch's worker handler ends a worker on a SIGTERM not from its parent, and its rank then fails
    with "worker killed by signal" mid-save; with the library's worker_init_fn the first one passes."""
    signals = DeferredSignals([signal.SIGTERM])
    assert signals.install()
    try:
        assert run_worker_and_signal_it_twice(init=True) == (True, signal.SIGTERM)
        assert run_worker_and_signal_it_twice(init=False) == (False, signal.SIGTERM)
    finally:
        signals.uninstall()


def test_a_signal_arriving_during_an_agreement_is_kept_for_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    """A handler runs between any two bytecodes: one that ran while the flags were being built was
    cleared with them, and its rank never stopped (a preempted run trained on to its end)."""
    import lightning_resumable.readers.worker_signals as signals_module

    signals = DeferredSignals([signal.SIGUSR1])
    assert signals.install()
    real_tensor = torch.tensor

    def tensor_and_a_signal(*args: object, **kwargs: object) -> torch.Tensor:
        made = real_tensor(*args, **kwargs)  # type: ignore[call-overload]
        os.kill(os.getpid(), signal.SIGUSR1)  # handled as soon as this returns
        return made

    try:
        with monkeypatch.context() as patched:
            patched.setattr(signals_module.torch, "tensor", tensor_and_a_signal)
            first = signals.agree(torch.device("cpu"))
        assert first | signals.agree(torch.device("cpu")) == {signal.SIGUSR1}
    finally:
        signals.uninstall()
