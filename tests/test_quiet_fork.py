"""A fork of the library's loaders waits until no native thread runs (CPython gh-112275: a gloo thread
entering Python after a collective holds the lock a forked child needs). The race itself is rare (18 hangs
in 40,000 forks on this machine): `benchmarks/fork_after_collective.py` measures it; these tests show the
decision, on a ``/proc`` of our own making, and the hook around real forks."""

from __future__ import annotations

import os
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_resumable import ResumableDataCallback
from lightning_resumable.readers import quiet_fork
from lightning_resumable.readers.quiet_fork import guarded_forks, running_native_threads
from lightning_resumable.readers.workers import WorkerSafeDataLoader, retire_previous

from .helpers import Data, Model, trainer


class FakeTasks:
    """A ``/proc/self/task`` whose threads' states a test sets (and changes as the hook polls)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def thread(self, tid: int, name: str, state: str) -> None:
        (self.root / str(tid)).mkdir(exist_ok=True)
        (self.root / str(tid) / "stat").write_text(f"{tid} ({name}) {state} 1 1 1 0 -1 4194560 0 0\n")


@pytest.fixture
def tasks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeTasks:
    monkeypatch.setattr(quiet_fork, "_TASKS", tmp_path)
    fake = FakeTasks(tmp_path)
    fake.thread(threading.get_native_id(), "python", "R")  # the caller runs, and does not count
    return fake


def test_the_running_native_threads_are_named_and_python_threads_are_not(tasks: FakeTasks) -> None:
    tasks.thread(9001, "pt_gloo_runloop", "R")
    tasks.thread(9002, "gloo_tcp_loop", "S")
    tasks.thread(9003, "a (name) with R ) in it", "D")
    tasks.thread(9004, "stopped", "t")
    stop = threading.Event()
    python_thread = threading.Thread(target=stop.wait)
    python_thread.start()
    try:
        assert python_thread.native_id is not None
        tasks.thread(python_thread.native_id, "busy python", "R")  # joined by the library, not waited for
        assert sorted(running_native_threads()) == ["a (name) with R ) in it (9003)", "pt_gloo_runloop (9001)"]
    finally:
        stop.set()
        python_thread.join()


def test_a_fork_waits_until_the_native_threads_sleep(tasks: FakeTasks, monkeypatch: pytest.MonkeyPatch) -> None:
    tasks.thread(9001, "pt_gloo_runloop", "R")
    polls: list[int] = []

    def yielding() -> None:  # the hook gives the GIL away; here the thread then goes to sleep
        polls.append(1)
        if len(polls) == 3:
            tasks.thread(9001, "pt_gloo_runloop", "S")

    monkeypatch.setattr(quiet_fork.os, "sched_yield", yielding)
    monkeypatch.setattr(quiet_fork, "_guarding", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet_fork._wait_for_quiet_native_threads()
    assert len(polls) == 3
    assert running_native_threads() == []


def test_a_thread_that_keeps_running_is_named_once_and_the_fork_goes_ahead(
    tasks: FakeTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    tasks.thread(9001, "omp_spinning", "R")
    monkeypatch.setattr(quiet_fork, "QUIET_WAIT_S", 0.01)
    monkeypatch.setattr(quiet_fork, "_warned", False)
    monkeypatch.setattr(quiet_fork, "_guarding", 1)
    with pytest.warns(RuntimeWarning, match=r"omp_spinning \(9001\).*gh-112275"):
        quiet_fork._wait_for_quiet_native_threads()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet_fork._wait_for_quiet_native_threads()  # once per process


def test_outside_the_block_a_fork_does_not_wait(tasks: FakeTasks, monkeypatch: pytest.MonkeyPatch) -> None:
    tasks.thread(9001, "pt_gloo_runloop", "R")
    monkeypatch.setattr(quiet_fork.os, "sched_yield", lambda: pytest.fail("waited outside guarded_forks"))
    quiet_fork._wait_for_quiet_native_threads()


@pytest.mark.skipif(not quiet_fork.affected_python(), reason="the hook is installed on an affected CPython only")
def test_real_forks_inside_the_block_run_the_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    wait = quiet_fork.running_native_threads
    monkeypatch.setattr(quiet_fork, "running_native_threads", lambda: (calls.append(1), wait())[1])

    def fork_and_reap() -> int:
        pid = os.fork()
        if pid == 0:
            os._exit(7)  # the child of a test fork: nothing of pytest's may run in it
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

    assert fork_and_reap() == 7 and calls == []
    with guarded_forks():
        assert fork_and_reap() == 7
    assert calls, "the fork inside the block asked which native threads run"
    calls.clear()
    assert fork_and_reap() == 7 and calls == []


@pytest.mark.skipif(not quiet_fork.affected_python(), reason="the hook is installed on an affected CPython only")
def test_the_library_s_loaders_fork_their_workers_inside_the_block(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    wait = quiet_fork.running_native_threads
    monkeypatch.setattr(quiet_fork, "running_native_threads", lambda: (calls.append(1), wait())[1])
    loader = WorkerSafeDataLoader(TensorDataset(torch.arange(8)), batch_size=4, num_workers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the affected-Python notice
        assert len(list(loader)) == 2
    retire_previous(loader)
    assert len(calls) >= 2, "each of the 2 workers' forks waited for quiet native threads"


class Validated(Data):
    """A validation loader of the user's own, with a worker: Lightning forks it during the fit."""

    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(TensorDataset(torch.arange(4).float().unsqueeze(1)), batch_size=2, num_workers=1)


@pytest.mark.skipif(not quiet_fork.affected_python(), reason="the hook is installed on an affected CPython only")
@pytest.mark.parametrize("fails", [False, True])
def test_during_a_fit_with_the_callback_every_fork_is_guarded_and_after_it_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: bool
) -> None:
    looked: list[str] = []
    wait = quiet_fork.running_native_threads
    monkeypatch.setattr(quiet_fork, "running_native_threads", lambda: (looked.append("fork"), wait())[1])

    class Validating(Model):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            looked.append("validation")
            if fails:
                raise RuntimeError("a failing validation")

    run = trainer(tmp_path, [ResumableDataCallback()], num_sanity_val_steps=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if fails:
            with pytest.raises(RuntimeError, match="a failing validation"):
                run.fit(Validating(), datamodule=Validated(size=8))
        else:
            run.fit(Validating(), datamodule=Validated(size=8))
    assert "validation" in looked, looked
    assert "fork" in looked[: looked.index("validation")], (
        "the validation worker's fork waited for quiet native threads"
    )
    assert quiet_fork._guarding == 0, "the guard ends with the fit"
    looked.clear()
    list(DataLoader(torch.arange(4), num_workers=1))
    assert looked == [], "a fork after the fit does not wait"
