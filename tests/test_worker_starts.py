"""Loader workers started by forkserver or spawn leave the held signals to their rank from their first
instruction (`lightning_resumable.readers.worker_starts`): a SIGTERM that reaches a worker while it starts (its
interpreter, its unpickling) or the forkserver itself ends neither while the rank holds, and both end on it as
without the library once the rank no longer holds. multiprocessing's private names the library reads are
checked here against the installed Python."""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_resumable import ResumableDataCallback, ResumableDataModule
from lightning_resumable.errors import UnsupportedLoaderError
from lightning_resumable.internals._multiprocessing import forkserver_pid, forkserver_preload, start_forkserver
from lightning_resumable.readers.worker_signals import (
    DeferredSignals,
    leave_signals_to_this_process,
    stop_leaving_signals,
)
from lightning_resumable.readers.worker_starts import (
    FORKSERVER_MODULE,
    leave_signals_to_workers,
    stop_leaving_signals_to_workers,
)

from .helpers import Model, scheduler_signals, trainer

FORKSERVER = "forkserver"


def running(pid: int) -> bool:
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None


@pytest.fixture
def holding() -> Iterator[DeferredSignals]:
    """This process holds SIGTERM and SIGUSR1, as a rank does during a fit."""
    signals = DeferredSignals([signal.SIGTERM, signal.SIGUSR1])
    assert signals.install()
    leave_signals_to_workers(leave_signals_to_this_process(signals.signums), signals.signums)
    try:
        yield signals
    finally:
        stop_leaving_signals()
        stop_leaving_signals_to_workers()
        signals.uninstall()


class SignalledWhileStarting(TensorDataset):
    """Unpickled in a worker that is not forked, before torch's worker loop runs: the worker signals itself
    there, as a job-wide SIGTERM reaching it while it starts."""

    def __init__(self, size: int) -> None:
        super().__init__(torch.arange(size))

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGUSR1)  # SLURM's requeue signal: the same


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_signal_that_reaches_a_worker_while_it_starts_ends_it_only_without_the_hold(
    method: str, request: pytest.FixtureRequest
) -> None:
    loader = DataLoader(SignalledWhileStarting(8), batch_size=2, num_workers=2, multiprocessing_context=method)
    with pytest.raises(RuntimeError, match=r"exited unexpectedly|killed by signal"):  # the control: no hold
        list(loader)
    request.getfixturevalue("holding")
    assert [batch[0].tolist() for batch in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_the_forkserver_started_while_holding_survives_a_sigterm_and_starts_the_next_workers(
    holding: DeferredSignals,
) -> None:
    loader = DataLoader(
        TensorDataset(torch.arange(8)), batch_size=2, num_workers=2, multiprocessing_context="forkserver"
    )
    assert len(list(loader)) == 4
    server = forkserver_pid()
    assert server is not None and FORKSERVER_MODULE in forkserver_preload()
    for signum in (signal.SIGTERM, signal.SIGUSR1):
        scheduler_signals(server, signum)
    assert [batch[0].tolist() for batch in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]  # the same server
    assert forkserver_pid() == server and running(server)
    stop_leaving_signals()  # the fit has ended: as without the library, the server ends on the signal
    scheduler_signals(server)
    ended = os.waitid(os.P_PID, server, os.WEXITED | os.WNOWAIT)  # multiprocessing reaps it: not this test
    assert ended is not None and ended.si_status == signal.SIGTERM


def test_multiprocessings_private_names_the_library_reads() -> None:
    assert isinstance(forkserver_preload(), list)
    pid = start_forkserver()
    assert forkserver_pid() == pid and running(pid)
    assert multiprocessing.get_context("forkserver").get_start_method() == "forkserver"


class Features(TensorDataset):
    def __init__(self, transform: Any = None) -> None:
        super().__init__(torch.arange(8).float().unsqueeze(1))
        self.transform = transform


def first_of(samples: list[Any]) -> Any:
    return torch.utils.data.default_collate(samples)


class Workers(ResumableDataModule, L.LightningDataModule):
    def __init__(self, method: str, what: str) -> None:
        super().__init__()
        self.method, self.what = method, what

    def train_dataloader(self) -> DataLoader[Any]:
        options: dict[str, Any] = {"dataset": Features(), "collate_fn": first_of, "worker_init_fn": None}
        if self.what == "dataset":
            options["dataset"] = Features(transform=lambda x: x)
        elif self.what == "collate_fn":
            options["collate_fn"] = lambda samples: torch.utils.data.default_collate(samples)
        elif self.what == "worker_init_fn":
            options["worker_init_fn"] = lambda worker: None
        return DataLoader(batch_size=2, shuffle=True, num_workers=2, multiprocessing_context=self.method, **options)


@pytest.mark.parametrize("what", ["dataset", "collate_fn", "worker_init_fn"])
@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_what_a_worker_not_forked_cannot_unpickle_is_refused_before_any_step_naming_it(
    tmp_path: Path, method: str, what: str
) -> None:
    model = Model()
    with pytest.raises(UnsupportedLoaderError, match=rf"start by {method}, which pickles its {what} .*local object"):
        trainer(tmp_path, [ResumableDataCallback()]).fit(model, Workers(method, what))
    assert model.seen == []


def test_the_same_loader_started_by_fork_needs_nothing_pickled(tmp_path: Path) -> None:
    model = Model()
    trainer(tmp_path, [ResumableDataCallback()]).fit(model, Workers("fork", "dataset"))
    assert len(model.seen) == 4
