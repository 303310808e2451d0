"""Preemption signals: `DeferredSignals` records a signal until the ranks agree on it and puts the original
handler back; a process forked while its parent holds them leaves them to it (`leave_signals_to_this_process`),
a torch loader worker included, until its loader shuts it down, its parent goes or stops holding; and a
one-process fit that gets SIGTERM before its train loop ends at the train start with Lightning's exception."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import OnExceptionCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.utils.data import DataLoader, TensorDataset

from lightning_resumable import ResumableDataCallback
from lightning_resumable.readers import worker_signals
from lightning_resumable.readers.worker_signals import (
    DeferredSignals,
    stop_leaving_signals,
)

from .helpers import Data, Model, scheduler_signals, trainer


def test_a_signal_is_recorded_then_agreed_on_once_and_the_original_handler_comes_back() -> None:
    handled: list[int] = []
    original = signal.signal(signal.SIGUSR1, lambda signum, frame: handled.append(signum))
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
        signal.signal(signal.SIGUSR1, original)


def test_uninstalling_leaves_a_handler_set_since_in_place() -> None:
    """Lightning's teardown puts its own originals back before the library lets go: those stay."""
    original = signal.getsignal(signal.SIGUSR1)
    signals = DeferredSignals([signal.SIGUSR1])
    assert signals.install()
    later = lambda signum, frame: None  # noqa: E731
    try:
        signal.signal(signal.SIGUSR1, later)
        signals.uninstall()
        assert signal.getsignal(signal.SIGUSR1) is later
    finally:
        signal.signal(signal.SIGUSR1, original)


def test_a_signal_arriving_during_an_agreement_is_kept_for_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    """A handler runs between any two bytecodes: one that ran while the flags were being built was
    cleared with them, and its rank never stopped (a preempted run trained on to its end)."""
    signals = DeferredSignals([signal.SIGUSR1])
    assert signals.install()
    available = worker_signals.dist.is_available

    def available_and_a_signal() -> bool:  # asked after the received signals were taken, before they are read
        os.kill(os.getpid(), signal.SIGUSR1)  # handled as soon as this returns
        return available()

    try:
        with monkeypatch.context() as patched:
            patched.setattr(worker_signals.dist, "is_available", available_and_a_signal)
            first = signals.agree(torch.device("cpu"))
        assert first | signals.agree(torch.device("cpu")) == {signal.SIGUSR1}
    finally:
        signals.uninstall()


# ------------------------------------------------------------------------ the processes a holder forks
_children: list[int] = []


@pytest.fixture(autouse=True)
def no_child_outlives_its_test() -> Iterator[None]:
    yield
    while _children:
        child = _children.pop()
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)


def forked(body: Callable[[Callable[[bytes], None]], None]) -> tuple[int, Callable[[], bytes]]:
    """Fork a child that runs ``body(say)`` and then waits for signals forever; ``say`` writes a byte to the
    parent, which reads them one at a time (``b""``: the child has ended). Killed at the test's end."""
    read_end, write_end = os.pipe()
    child = os.fork()
    _children.append(child)
    if child == 0:  # pragma: no cover  (the child)
        os.close(read_end)
        try:
            body(lambda byte: os.write(write_end, byte) and None)
            while True:
                signal.pause()
        finally:
            os._exit(3)
    os.close(write_end)
    return child, lambda: os.read(read_end, 1)


def left_to_holder(say: Callable[[bytes], None]) -> None:
    """In the child: say when its handler has run, once per signal (it leaves no other trace)."""
    handler = signal.getsignal(signal.SIGTERM)
    assert isinstance(handler, worker_signals.LeftToHolder)
    count = 0
    original_leaves = handler.leaves

    def leaves() -> bool:
        nonlocal count
        count += 1
        left = original_leaves()
        if left:
            say(b"l")
        return left

    handler.leaves = leaves  # type: ignore[method-assign]
    say(b"r")


def ended_by(child: int) -> int:
    _, status = os.waitpid(child, 0)
    return os.WTERMSIG(status) if os.WIFSIGNALED(status) else -os.WEXITSTATUS(status)


def test_a_forked_process_leaves_the_signals_to_its_holder_until_it_stops_holding(holding: DeferredSignals) -> None:
    child, heard = forked(left_to_holder)
    assert heard() == b"r"
    for _ in range(3):  # every one, not only the first: a second preemption signal ends no worker mid-save
        scheduler_signals(child)
        assert heard() == b"l"
    scheduler_signals(child, signal.SIGUSR1)  # SLURM's requeue signal: the same
    assert heard() == b"l"
    assert holding.received == frozenset()  # a child's signal is not its holder's
    stop_leaving_signals()  # the fit has ended: as without the library, a SIGTERM ends it
    scheduler_signals(child)
    assert heard() == b""
    assert ended_by(child) == signal.SIGTERM


def assert_an_orphan_ends_on_the_signal(once_orphaned: Callable[[int], None] | None = None) -> None:
    """Fork a child that forks a grandchild (inheriting the hold) and ends; once orphaned, the grandchild runs
    ``once_orphaned(the pid of the child, its parent that ended)``, if given; then it is signalled as a scheduler
    does, and must end within 10 s (not this process's child: /proc polled, a signal's delivery is asynchronous)."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover  (the child: forks its own child, says its pid, and goes)
        parent = os.getpid()

        def when_orphaned(say: Callable[[bytes], None]) -> None:
            if once_orphaned is None:
                return
            while os.getppid() == parent:
                signal.sigtimedwait([], 0.001)
            once_orphaned(parent)
            os.write(write_end, b"h")

        grandchild, _ = forked(when_orphaned)
        os.write(write_end, f"{grandchild:>10}".encode())
        os._exit(0)
    os.close(write_end)
    grandchild = int(os.read(read_end, 10))
    try:
        assert ended_by(child) == 0
        if once_orphaned is not None:
            assert os.read(read_end, 1) == b"h"  # (b"": it failed)
        scheduler_signals(grandchild)
        for _ in range(1000):
            stat = Path(f"/proc/{grandchild}/stat")
            if not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return
            signal.sigtimedwait([], 0.01)
        raise AssertionError("the orphaned process ignored SIGTERM")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(grandchild, signal.SIGKILL)


def test_a_process_whose_holder_has_gone_ends_on_the_signal(holding: DeferredSignals) -> None:
    """A worker whose parent was killed is not the parent's to keep alive: its grandchild here, forked while the
    child held nothing of its own but inherited the hold, is orphaned, then signalled."""
    assert_an_orphan_ends_on_the_signal()


def test_a_process_whose_parent_ended_before_its_fork_hook_ran_ends_on_the_signal(holding: DeferredSignals) -> None:
    """A child whose parent ended before the child's at-fork hook ran saw init as its parent there, and left the
    signals to init, the holder still holding: it ignored SIGTERM (CI, the oldest versions' step under ``-n 2``:
    `test_a_process_whose_holder_has_gone_ends_on_the_signal` 1 run). Here the grandchild runs its hook again once
    orphaned, as a hook that came late would."""
    assert_an_orphan_ends_on_the_signal(lambda parent: worker_signals._in_forked_child())


def test_a_worker_not_forked_whose_holder_ended_before_its_loop_started_ends_on_the_signal(
    holding: DeferredSignals, tmp_path: Path
) -> None:
    """A worker started by spawn (or by a forkserver) sets its handler as its loop starts, in a new interpreter:
    one whose holder ended before then took init (``getppid()``) for its parent, left the signals to it (the
    record still says the holder holds) and ignored SIGTERM. Here the child is the holder, and the grandchild,
    orphaned, starts its loop as a spawned worker of the child does, with the child's pid handed to it. The
    record is the test's own, saying the holder holds, as a killed holder's still says (the holder's own may be
    removed by any process on the machine once the holder has gone)."""
    record = tmp_path / "record"
    record.write_bytes(b"\1")

    def loop_starts(holder: int) -> None:
        worker_signals._arranged_in = 0  # not forked: a spawned worker's handler is set as its loop starts
        assert not worker_signals.leave_signals_in_this_worker(str(record), (signal.SIGTERM,), holder)

    assert_an_orphan_ends_on_the_signal(loop_starts)


def torch_worker(say: Callable[[bytes], None]) -> None:
    """In the child: start as torch's ``_worker_loop`` does (its own SIGTERM handler first, from a frame
    whose ``done_event`` is the loader's), then say when the held SIGTERM was left to the holder; ``d`` on
    SIGUSR2 sets ``done_event``, as the loader's shutdown does."""
    import multiprocessing

    from torch.utils.data._utils import signal_handling

    done_event = multiprocessing.Event()
    signal_handling._set_worker_signal_handlers()  # type: ignore[attr-defined]
    assert done_event is not None  # the frame's local that the library reads
    signal.signal(signal.SIGUSR2, lambda signum, frame: (done_event.set(), say(b"d")))
    left_to_holder(say)


def test_a_torch_worker_leaves_a_schedulers_sigterm_to_its_rank_until_its_loader_shuts_it_down(
    holding: DeferredSignals,
) -> None:
    """Torch's worker handler ends a worker on a SIGTERM not from its parent (its rank then fails with "worker
    killed by signal" or hangs in a collective); while the rank holds, the worker leaves it to the rank. Once its
    loader is shutting it down (``done_event``), a SIGTERM (torch's ``terminate``, or a scheduler's then) ends it
    with status 0, as torch's handler ends a worker on its parent's: its rank, still watching, sees no failure."""
    child, heard = forked(torch_worker)
    assert heard() == b"r"
    scheduler_signals(child)
    assert heard() == b"l"
    os.kill(child, signal.SIGUSR2)
    assert heard() == b"d"
    scheduler_signals(child)
    assert heard() == b""
    assert ended_by(child) == 0


def test_a_sigterm_right_after_torch_set_its_worker_handler_is_left_to_the_rank_too(
    holding: DeferredSignals, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between torch's handler and the library's there is a moment: a SIGTERM then (here sent from within torch's
    setup, synchronously) waits until the library's handler is in place (a group signal at the next epoch's
    workers' start once ended a worker of rank 1 that way)."""
    from torch.utils.data._utils import signal_handling

    torch_sets = signal_handling._set_worker_signal_handlers  # type: ignore[attr-defined]

    def sets_then_a_signal_arrives() -> None:
        torch_sets()
        scheduler_signals(os.getpid())

    monkeypatch.setattr(signal_handling, "_set_worker_signal_handlers", sets_then_a_signal_arrives)
    child, heard = forked(torch_worker)
    assert heard() == b"r"  # alive: the signal waited, then went to the library's handler, which left it
    stop_leaving_signals()
    scheduler_signals(child)
    assert heard() == b""
    assert ended_by(child) == signal.SIGTERM


def test_without_the_hold_a_torch_worker_dies_of_a_schedulers_sigterm() -> None:
    """The control: what the first epoch's workers did before the hold began at the callback's setup."""

    def plain_worker(say: Callable[[bytes], None]) -> None:
        from torch.utils.data._utils import signal_handling

        signal_handling._set_worker_signal_handlers()  # type: ignore[attr-defined]
        say(b"r")

    child, heard = forked(plain_worker)
    assert heard() == b"r"
    scheduler_signals(child)
    assert heard() == b""
    assert ended_by(child) == signal.SIGTERM


class Slow(TensorDataset):
    """Each sample waits until its worker has been signalled (a file per worker), so the signals arrive while
    the workers serve the pass."""

    def __init__(self, size: int, flags: Path) -> None:
        super().__init__(torch.arange(size))
        self.flags = flags

    def __getitem__(self, index: int) -> Any:
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        assert info is not None
        (self.flags / f"pid{info.id}").write_text(str(os.getpid()))
        while not (self.flags / f"signalled{info.id}").exists():
            signal.sigtimedwait([], 0.005)  # waits for the test's signal, not for a race: the file says it came
        return super().__getitem__(index)


START_METHODS = ("fork", "forkserver", "spawn")


@pytest.mark.parametrize("method", START_METHODS)
@pytest.mark.parametrize("hold", [True, False])
def test_a_real_loaders_workers_serve_their_pass_through_a_schedulers_sigterm(
    tmp_path: Path, hold: bool, method: str, request: pytest.FixtureRequest
) -> None:
    """A torch DataLoader with 2 workers started by ``method``, each signalled by a scheduler while it serves the
    pass: with the hold, every batch arrives; without it (the control) the loader fails with "worker ... killed
    by signal"."""
    if hold:
        request.getfixturevalue("holding")
    loader = DataLoader(Slow(8, tmp_path), batch_size=2, num_workers=2, multiprocessing_context=method)

    def served() -> list[list[int]]:
        iterator = iter(loader)
        for worker in range(2):
            pid = tmp_path / f"pid{worker}"
            for _ in range(6000):  # until the worker has started its first sample (it writes its pid)
                if pid.exists() and pid.read_text():
                    break
                signal.sigtimedwait([], 0.005)
            scheduler_signals(int(pid.read_text()))
            (tmp_path / f"signalled{worker}").touch()
        return [batch[0].tolist() for batch in iterator]

    if hold:
        assert served() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    else:  # torch's SIGCHLD handler raises wherever this process is when a worker dies: anywhere in served()
        with pytest.raises(RuntimeError, match=r"killed by signal: Terminated|exited unexpectedly"):
            served()
        # Raised before worker 1 was signalled (the first worker's death came first), worker 1 still waits in its
        # sample for its file: its iterator, freed with this test, then waited 5 s to join it (1 CI run in many).
        for worker in range(2):
            (tmp_path / f"signalled{worker}").touch()


@pytest.mark.parametrize("method", START_METHODS)
def test_a_schedulers_sigterm_while_a_loader_shuts_its_workers_down_fails_nothing(
    holding: DeferredSignals, tmp_path: Path, method: str
) -> None:
    """A group SIGTERM that reaches workers while their loader is joining them (its ``done_event`` set, their
    pids still watched by torch's SIGCHLD handler): killed by the signal, they failed the rank with "DataLoader
    worker ... is killed by signal" (seen in the matrix, torchrun signalling each rank's group at an epoch's
    end); they now end with status 0."""
    loader = DataLoader(Slow(8, tmp_path), batch_size=2, num_workers=2, multiprocessing_context=method)
    iterator: Any = iter(loader)
    pids = []
    for worker in range(2):
        pid = tmp_path / f"pid{worker}"
        for _ in range(6000):  # until the worker is inside its first sample, where it stays
            if pid.exists() and pid.read_text():
                break
            signal.sigtimedwait([], 0.005)
        pids.append(int(pid.read_text()))

    def scheduler() -> None:  # once the loader has begun its shutdown: the workers are being joined
        while not iterator._workers_done_event.is_set():
            signal.sigtimedwait([], 0.002)
        for pid in pids:
            scheduler_signals(pid)

    sender = threading.Thread(target=scheduler)
    sender.start()
    try:
        iterator._shutdown_workers()  # raised "killed by signal" from torch's SIGCHLD handler
    finally:
        sender.join()
    assert [worker.exitcode for worker in iterator._workers] == [0, 0]


# ----------------------------------------------------------------------------------- one-process fits
class SignalledAt(L.Callback):
    """Sends this process SIGTERM in ``hook``, as a scheduler's notice arriving then."""

    def __init__(self, hook: str) -> None:
        setattr(self, hook, self.signal)

    def signal(self, *args: object, **kwargs: object) -> None:
        os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.parametrize("hook", ["setup", "on_fit_start", "on_train_epoch_start"])
def test_a_sigterm_before_the_train_loop_ends_the_fit_at_its_start(tmp_path: Path, hook: str) -> None:
    """Held from the callback's setup (after it in the callbacks' order): a SIGTERM in setup or before the train
    loop ends the fit at the train start with Lightning's SIGTERMException, no batch trained, and
    ``OnExceptionCheckpoint``'s checkpoint resumes the whole run. ``on_train_epoch_start`` comes after the train
    start: its signal ends the fit after the first batch."""
    before = signal.getsignal(signal.SIGTERM)
    L.seed_everything(5, verbose=False)  # the three fits' seed
    model = Model()
    saving = OnExceptionCheckpoint(tmp_path, filename="on_exception")
    stopped = trainer(tmp_path, [ResumableDataCallback(), SignalledAt(hook), saving], enable_checkpointing=True)
    with pytest.raises(SIGTERMException):
        stopped.fit(model, Data())
    trained = 1 if hook == "on_train_epoch_start" else 0
    assert len(model.seen) == trained
    assert signal.getsignal(signal.SIGTERM) is before  # given back
    full = Model()
    trainer(tmp_path / "full", [ResumableDataCallback()]).fit(full, Data())
    resumed = Model()
    trainer(tmp_path / "resume", [ResumableDataCallback()]).fit(
        resumed, Data(), ckpt_path=tmp_path / "on_exception.ckpt"
    )
    assert model.seen + resumed.seen == full.seen


class Validated(Model):
    """Records the global step of each validation of a fit (not the sanity check's)."""

    def __init__(self) -> None:
        super().__init__()
        self.validated: list[int] = []

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if not self.trainer.sanity_checking and batch_idx == 0:
            self.validated.append(self.trainer.global_step)


class ValidatedData(Data):
    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(TensorDataset(torch.arange(4).float().unsqueeze(1)), batch_size=2)


class StopAfter(L.Callback):
    """Saves after batch ``batch``'s end (before the validation due after it) and stops the fit there."""

    def __init__(self, batch: int, path: Path) -> None:
        self.batch, self.path = batch, path

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.batch + 1:
            trainer.save_checkpoint(self.path)
            raise KeyboardInterrupt  # (Lightning's graceful stop; the save above is the one resumed)


def test_a_fit_preempted_before_its_first_batch_keeps_the_validation_its_restore_left_due(tmp_path: Path) -> None:
    """Resumed from a save at a batch's end with a validation due after it, a fit that a SIGTERM in setup ends at
    the train start writes the loops it was restored from: the run resumed from that checkpoint validates at
    every step the uninterrupted run did (it skipped the due one when the live loops, reset by Lightning's
    restart, were written)."""
    L.seed_everything(5, verbose=False)
    options = {"val_check_interval": 2, "num_sanity_val_steps": 0, "enable_checkpointing": True}
    full = Validated()
    trainer(tmp_path / "full", [ResumableDataCallback()], **options).fit(full, ValidatedData())
    assert full.validated == [2, 4, 6, 8]
    first, stopped = tmp_path / "stopped.ckpt", Validated()
    with pytest.raises(SystemExit):
        trainer(tmp_path / "stop", [ResumableDataCallback(), StopAfter(3, first)], **options).fit(
            stopped, ValidatedData()
        )
    preempted = Validated()
    saving = OnExceptionCheckpoint(tmp_path, filename="on_exception")
    signalled = [ResumableDataCallback(), SignalledAt("setup"), saving]
    with pytest.raises(SIGTERMException):
        trainer(tmp_path / "preempt", signalled, **options).fit(preempted, ValidatedData(), ckpt_path=first)
    assert preempted.seen == [] and preempted.validated == []
    resumed = Validated()
    checkpoint = tmp_path / "on_exception.ckpt"
    trainer(tmp_path / "resume", [ResumableDataCallback()], **options).fit(
        resumed, ValidatedData(), ckpt_path=checkpoint
    )
    assert stopped.seen[:4] + resumed.seen == full.seen
    assert [step for step in stopped.validated if step < 4] + resumed.validated == full.validated


class SignalledThenFailing(Model):
    """A step in which this process gets SIGTERM, then fails (a worker that died of it, as torch reports one)."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if batch_idx == 1:
            os.kill(os.getpid(), signal.SIGTERM)
            raise RuntimeError("DataLoader worker (pid(s) 1) exited unexpectedly")
        return super().training_step(batch, batch_idx)


def test_a_signal_the_ranks_had_not_agreed_on_when_an_exception_ended_the_fit_is_not_said_to_come_after_the_last_batch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The fit ends by the exception it raised, and the log says the signal came before it (it said "after the
    last training batch", at batch 1 of 4)."""
    with caplog.at_level("INFO"), pytest.raises(RuntimeError, match="exited unexpectedly"):
        trainer(tmp_path, [ResumableDataCallback()]).fit(SignalledThenFailing(), Data())
    assert "signal 15 arrived before the fit ended by an exception; it changed nothing" in caplog.text
    assert "after the last training batch" not in caplog.text


def test_a_holder_removes_the_records_of_holders_that_ended_without_removing_them(tmp_path: Path) -> None:
    """A holder killed (as a scheduler kills after its grace period) leaves its record, a page of shared memory
    until a reboot: 4,622 of them here after a day of tests. The next holder in the namespace removes them."""
    ended = os.fork()
    if ended == 0:  # pragma: no cover
        os._exit(0)
    os.waitpid(ended, 0)
    prefix = worker_signals._record_prefix()
    names = {
        "ended": f"{prefix}{ended}-abc",
        "alive": f"{prefix}{os.getpid()}-abc",
        "other namespace": f"lightning-resumable-holder-1-{ended}-abc",
        "not a record": f"{ended}-abc",
    }
    for name in names.values():
        (tmp_path / name).write_bytes(b"\1")
    worker_signals._remove_ended_holders_records(str(tmp_path), prefix)
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        names[kept] for kept in ("alive", "other namespace", "not a record")
    )
