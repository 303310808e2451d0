"""Loader workers started by forkserver or spawn leave the held signals to their rank from their first
instruction (`lightning_resumable.readers.worker_starts`): a SIGTERM that reaches a worker while it starts (its
interpreter, its unpickling) or the forkserver itself ends neither while the rank holds, and both end on it as
without the library once the rank no longer holds. multiprocessing's private names the library reads are
checked here against the installed Python."""

from __future__ import annotations

import atexit
import functools
import multiprocessing
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_resumable import ResumableDataCallback, ResumableDataModule
from lightning_resumable.errors import UnsupportedLoaderError
from lightning_resumable.internals._multiprocessing import (
    ensure_resource_tracker,
    forkserver_pid,
    forkserver_preload,
    protect_resource_tracker,
    start_forkserver,
)
from lightning_resumable.readers.worker_signals import (
    DeferredSignals,
    stop_leaving_signals,
)
from lightning_resumable.readers.worker_starts import (
    FORKSERVER_MODULE,
)

from .helpers import Model, scheduler_signals, trainer

FORKSERVER = "forkserver"


def running(pid: int) -> bool:
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None


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
    iterator: Any = iter(loader)
    with pytest.raises(RuntimeError, match=r"exited unexpectedly|killed by signal"):  # the control: no hold
        list(iterator)
    for worker in iterator._workers:  # the other one dies as it starts too: not a slow shutdown of the iterator's
        worker.join()
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
    from multiprocessing import resource_tracker

    stop = protect_resource_tracker([signal.SIGTERM, signal.SIGUSR1])  # on the tracker instance, then undone
    try:
        assert "ensure_running" in vars(resource_tracker._resource_tracker)
        ensure_resource_tracker()
        assert resource_tracker.getfd() is not None  # getfd goes through ensure_running
    finally:
        stop()
    assert "ensure_running" not in vars(resource_tracker._resource_tracker)


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


TORCH_WORKER_LOOP = torch.utils.data._utils.worker._worker_loop  # (imported here before any test replaces it)


def worker_loop_of_a_library(*args: Any, **kwargs: Any) -> Any:
    """A worker loop a data library or a user put in torch's place before the fit, calling torch's."""
    return TORCH_WORKER_LOOP(*args, **kwargs)


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
@pytest.mark.parametrize("replaced", ["a function", "a partial"])
def test_a_worker_loop_put_in_torchs_place_before_the_hold_still_runs_in_a_worker_not_forked(
    method: str, replaced: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.utils.data._utils import worker

    loop = worker_loop_of_a_library if replaced == "a function" else functools.partial(worker_loop_of_a_library)
    monkeypatch.setattr(worker, "_worker_loop", loop)
    request.getfixturevalue("holding")
    loader = DataLoader(SignalledWhileStarting(8), batch_size=2, num_workers=2, multiprocessing_context=method)
    assert [batch[0].tolist() for batch in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def what_failed(ran: subprocess.CompletedProcess[str]) -> str:
    """A failed script's output, whole but for the tracebacks a relaunched resource tracker prints for each
    semaphore registered with the one that was killed (expected, and enough of them to push the script's own
    error out of a tail): its stdout, and its stderr from the start."""
    expected = re.compile(r"Traceback \(most recent call last\):\n(?:  .*\n)+KeyError: '/mp-\w+'\n")
    return f"stdout:\n{ran.stdout[-2000:]}\nstderr:\n{expected.sub('', ran.stderr)[:6000]}"


GROUP_SIGNALLED = """
import multiprocessing, os, signal, subprocess, sys, time
import torch
from torch.utils.data import DataLoader, TensorDataset
from lightning_resumable.readers.worker_signals import DeferredSignals, leave_signals_to_this_process
from lightning_resumable.readers.worker_starts import leave_signals_to_workers


class Slow(TensorDataset):
    def __getitem__(self, index):
        time.sleep(0.05)
        return super().__getitem__(index)


if __name__ == "__main__":
    method, after_s = sys.argv[1], float(sys.argv[2])
    if method.startswith("default:"):
        multiprocessing.set_start_method(method.removeprefix("default:"), force=True)
    signals = DeferredSignals([signal.SIGTERM, signal.SIGUSR1])
    signals.install()
    leave_signals_to_workers(leave_signals_to_this_process(signals.signums), signals.signums)
    context = None if method.startswith("default:") else method
    loader = DataLoader(Slow(torch.arange(64)), batch_size=2, num_workers=2, multiprocessing_context=context)
    group = os.getpgrp()
    kill = f"import os, signal, time; time.sleep({after_s}); os.killpg({group}, signal.SIGTERM)"
    subprocess.Popen([sys.executable, "-c", kill], start_new_session=True)  # as a scheduler, from outside
    started = time.monotonic()
    batches = sum(1 for _ in loader)
    time.sleep(max(0.0, after_s + 0.5 - (time.monotonic() - started)))  # the signal has come: its record is read
    print("batches", batches, "received", sorted(signals.received), flush=True)
"""


@pytest.mark.parametrize(
    ("method", "after_s"),
    [
        *((method, after_s) for method in ("forkserver", "spawn") for after_s in (0.3, 1.5, 2.9)),
        ("default:forkserver", 1.5),  # (the same mechanism as given to the loader: one moment each, CI's time)
        ("default:spawn", 1.5),
    ],
)
def test_a_process_groups_sigterm_while_workers_not_forked_start_serve_or_exit_ends_none_of_them(
    tmp_path: Path, method: str, after_s: float
) -> None:
    """A fresh process (no resource tracker, no forkserver yet: as a rank's first loader), its process group
    signalled from outside after ``after_s``: while its workers start (importing), while they serve, and near the
    pass's end, as they exit. Found: multiprocessing's resource tracker, started with a spawned worker's first
    start, unblocked SIGTERM before the worker was started; and a worker that was not forked put the default
    handler back in its interpreter's finalization, killed there while its rank still watched it."""
    script = tmp_path / "group_signalled.py"
    script.write_text(GROUP_SIGNALLED)
    ran = subprocess.run(
        [sys.executable, str(script), method, str(after_s)],
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
    )
    assert ran.returncode == 0, what_failed(ran)
    assert ran.stdout.strip().splitlines()[-1] == "batches 32 received [15]"


TRACKER_KILLED = """
import multiprocessing, os, signal, subprocess, sys, time
from multiprocessing import resource_tracker
import torch
from torch.utils.data import DataLoader, TensorDataset
from lightning_resumable.readers.worker_signals import DeferredSignals, leave_signals_to_this_process
from lightning_resumable.readers.worker_starts import leave_signals_to_workers

pickled = 0


class RequeuedWhileSpawning(TensorDataset):
    def __getstate__(self):
        # Pickled in the rank for each worker it spawns: SLURM's requeue signal reaches the job as the first worker
        # is launched, the requeue's SIGTERM as the second one is (both still importing when it lands).
        global pickled
        pickled += 1
        if pickled == 1:
            os.killpg(os.getpgrp(), signal.SIGUSR1)
        if pickled == 2:
            kill = f"import os, signal, time; time.sleep(0.5); os.killpg({os.getpgrp()}, signal.SIGTERM)"
            subprocess.Popen([sys.executable, "-c", kill], start_new_session=True)
        return self.__dict__


if __name__ == "__main__":
    tracker = sys.argv[1]
    signals = DeferredSignals([signal.SIGTERM, signal.SIGUSR1])
    signals.install()
    if tracker == "before the hold":
        resource_tracker.ensure_running()  # as a loader iterated before the fit starts it
    leave_signals_to_workers(leave_signals_to_this_process(signals.signums), signals.signums)
    loader = DataLoader(RequeuedWhileSpawning(torch.arange(8)), batch_size=2, num_workers=2,
                        multiprocessing_context="spawn")
    batches = sum(1 for _ in loader)
    time.sleep(0.5)
    print("batches", batches, "received", sorted(signals.received), flush=True)
"""


@pytest.mark.parametrize("tracker", ["before the hold", "by the first worker"])
def test_a_requeue_signal_to_the_group_while_workers_spawn_ends_none_of_them(tmp_path: Path, tracker: str) -> None:
    """SLURM's requeue signal (SIGUSR1) to the whole job killed multiprocessing's resource tracker, which ignores
    only SIGINT and SIGTERM; the next worker's launch started another, and CPython unblocks SIGTERM after starting
    it: the rank's block of the held signals ended there, and the requeue's SIGTERM killed the worker still
    starting (preemption seed 157: the rank failed, and a worker left running hung its exit)."""
    script = tmp_path / "tracker_killed.py"
    script.write_text(TRACKER_KILLED)
    ran = subprocess.run(
        [sys.executable, str(script), tracker], capture_output=True, text=True, timeout=120, start_new_session=True
    )
    assert ran.returncode == 0, what_failed(ran)
    assert ran.stdout.strip().splitlines()[-1] == "batches 4 received [10, 15]"


SIGNALLED_AS_FORKED = """
import os, signal

def _signalled_as_forked():  # the job's signals land in a process the server has just forked, before its own hook
    signal.raise_signal(signal.SIGTERM)  # (delivered and handled before this returns)
    signal.raise_signal(signal.SIGUSR1)

os.register_at_fork(after_in_child=_signalled_as_forked)
"""

FORKED_BY_THE_SERVER = """
import multiprocessing, signal, sys
import torch
from torch.utils.data import DataLoader, TensorDataset
from lightning_resumable.readers.worker_signals import DeferredSignals, leave_signals_to_this_process
from lightning_resumable.readers.worker_starts import leave_signals_to_workers

if __name__ == "__main__":
    multiprocessing.set_forkserver_preload(["signalled_as_forked"])  # a user's module: its hook runs first
    signals = DeferredSignals([signal.SIGTERM, signal.SIGUSR1])
    signals.install()
    leave_signals_to_workers(leave_signals_to_this_process(signals.signums), signals.signums)
    loader = DataLoader(TensorDataset(torch.arange(8)), batch_size=2, num_workers=2,
                        multiprocessing_context="forkserver")
    print("batches", sum(1 for _ in loader), "received", sorted(signals.received), flush=True)
"""


def test_a_signal_that_reaches_a_worker_the_forkserver_has_just_forked_ends_none_of_them(tmp_path: Path) -> None:
    """Between the server's fork and the child's at-fork hook, the child has the server's handler, which leaves the
    signal to the rank only in a process whose parent is the rank: the worker killed itself there (preemption seed
    370759702, SIGTERM to the group as the first worker of an epoch started: its rank failed with "DataLoader worker
    exited unexpectedly", and the other one, never told, hung in its next all-reduce)."""
    (tmp_path / "signalled_as_forked.py").write_text(SIGNALLED_AS_FORKED)
    script = tmp_path / "forked_by_the_server.py"
    script.write_text(FORKED_BY_THE_SERVER)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    ran = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
        env=environment,
    )
    assert ran.returncode == 0, what_failed(ran)
    assert ran.stdout.strip().splitlines()[-1] == "batches 4 received []"


class ExitWatched(TensorDataset):
    """In each worker that unpickles it, an ``atexit`` handler that touches ``marker``: it runs only in the
    interpreter's finalization."""

    def __init__(self, size: int, marker: str) -> None:
        super().__init__(torch.arange(size))
        self.marker = marker

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        atexit.register(Path(self.marker).touch)


def test_a_spawned_worker_ends_as_a_forked_one_without_the_interpreters_finalization(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A spawned worker exits through the interpreter's finalization, a collection of every object of torch and
    Lightning: seconds each on a busy machine, while its rank waits to join it (preemption seed 307265078: two
    loaders and a validation loader with 2 spawned workers each; the ranks' teardown after a requeue outlasted the
    minute the harness gives it). While a rank holds, a worker not forked ends as a forked one: multiprocessing's
    finalizers, then ``os._exit``. The control, without the hold, finalizes."""
    marker = tmp_path / "finalized"
    loader = DataLoader(ExitWatched(8, str(marker)), batch_size=2, num_workers=1, multiprocessing_context="spawn")
    assert [batch[0].tolist() for batch in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]  # its worker joined after
    assert marker.exists(), "the control: without the hold a spawned worker goes through the finalization"
    marker.unlink()
    request.getfixturevalue("holding")
    assert [batch[0].tolist() for batch in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert not marker.exists()
