"""Preempting a run of `train.py` as a cluster does, and resuming it: shared by the preemption tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from . import processes
from .harness import (
    FIELDS,
    FORK,
    RUN_TIMEOUT_S,
    TRAIN_SCRIPT,
    WITH_PARAMETERS,
    Outcome,
    Records,
    Runner,
    Scenario,
    fork_server,
    read_records,
    read_validations,
)

SLURM_JOB_ID = "4242"

STEP_SECONDS = 0.05
SIGNAL_AT_STEP = {"map": 16, "stream": 8, "hf": 8, "hf-interleaved": 8, "wds": 8, "mosaic": 8}
"""Rank 0's step after which a test signals: mid-epoch, for the data of each kind of scenario."""
PREEMPTION_TIMEOUT_S = 120


def config(run: Path, phase: str, scenario: Scenario, **extra: Any) -> Path:
    values = {
        **asdict(scenario),
        "phase": phase,
        "out_dir": str(run),
        "first_world_size": scenario.world_size,
        "checkpoint": str(run / "on_exception.ckpt"),
        "stop": {"kind": "none", "epoch": -1, "batch": -1},
        "val_check_interval": 1.0,
        "on_exception_checkpoint": True,
        **extra,
    }
    path = run / f"{phase}.json"
    path.write_text(json.dumps(values))
    return path


def launch(run: Path, phase: str, scenario: Scenario, **extra: Any) -> Any:
    """A run in a session of its own (a ``Popen``, or the fork server's leader: both ``poll``, ``wait``
    and name the process group by ``pid``), from the fork server unless ``E2E_FORK_SERVER=0``."""
    run.mkdir(parents=True, exist_ok=True)
    path, log = config(run, phase, scenario, **extra), run / f"{phase}.log"
    if FORK:
        return fork_server().launch(path, scenario.world_size, log, run)
    command = [sys.executable, str(TRAIN_SCRIPT), str(path)]
    return processes.launch(command, log, run, {**os.environ, "PYTHONUNBUFFERED": "1"})


def wait_for_steps(process: Any, run: Path, steps: int) -> None:
    """Poll rank 0's step records until it has trained ``steps`` steps."""
    records, deadline = run / "preempt.rank0.jsonl", time.monotonic() + RUN_TIMEOUT_S
    while not records.exists() or len(records.read_text().splitlines()) < steps:
        assert process.poll() is None, f"the run ended early: {(run / 'preempt.log').read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"step {steps} not reached in {RUN_TIMEOUT_S} s"
        time.sleep(0.01)  # polling a file, not waiting out a race


def rank_pids(run: Path, world_size: int = 2) -> list[int]:
    return [int((run / f"preempt.rank{rank}.pid").read_text()) for rank in range(world_size)]


def saved_position(checkpoint: Path) -> tuple[int, int]:
    """(epoch, batches completed) the checkpoint's data state resumes after (a loader's, or a stream's)."""
    envelope = torch.load(checkpoint, weights_only=True)["callbacks"]["ResumableDataCallback"]
    assert "state" in envelope, f"the checkpoint holds no data state: {envelope}"
    state = envelope["state"].get("train", envelope["state"])
    return state["epoch"], state["batches"]


def before(records: Records, position: tuple[int, int]) -> Records:
    """Each rank's steps before ``position``: a rank may have run one step past the checkpoint's."""
    return {
        rank: [step for step in steps if (step["epoch"], step["batch"]) < position] for rank, steps in records.items()
    }


def steps_of(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What each step trained and computed: ids, augmentation values, loss bits."""
    return [{field: step[field] for field in FIELDS if field in step} for step in records]


SIGNALLED = {
    "every rank": lambda run, process: [os.kill(pid, signal.SIGTERM) for pid in rank_pids(run)],
    "rank 0": lambda run, process: os.kill(rank_pids(run)[0], signal.SIGTERM),
    "rank 1": lambda run, process: os.kill(rank_pids(run)[1], signal.SIGTERM),  # Lightning alone: rank 0 waits
    "the process group": lambda run, process: os.killpg(process.pid, signal.SIGTERM),
}


def preempt_and_resume(runner: Runner, run: Path, scenario: Scenario, target: str) -> None:
    """Signal ``target`` mid-run; the run must end with a checkpoint that resumes exactly."""
    full = runner.full(scenario)
    process = launch(run, "preempt", scenario, step_seconds=STEP_SECONDS)
    wait_for_steps(process, run, SIGNAL_AT_STEP[scenario.data])
    SIGNALLED[target](run, process)
    processes.wait_tree(process, PREEMPTION_TIMEOUT_S, f"the run after a SIGTERM to {target}", run, run / "preempt.log")
    checkpoint = run / "on_exception.ckpt"
    assert checkpoint.exists(), f"no checkpoint: {(run / 'preempt.log').read_text()[-3000:]}"
    position = saved_position(checkpoint)
    assert (0, 0) < position < (scenario.epochs, 0), position
    resume_and_compare(full, run, scenario, position, target)


def resume_and_compare(full: Records, run: Path, scenario: Scenario, position: tuple[int, int], what: str) -> None:
    path, log = config(run, "resume", scenario), run / "resume.log"
    if FORK:  # no signal is aimed at the resume: it starts from the fork server, as the harness's runs do
        resumed_code = fork_server().run(path, scenario.world_size, log, run, RUN_TIMEOUT_S, "the resume")
    else:
        resumed_code = processes.run_tree(
            [sys.executable, str(TRAIN_SCRIPT), str(path)], log, run, RUN_TIMEOUT_S, "the resume"
        )
    assert resumed_code == 0, (run / "resume.log").read_text()[-3000:]
    trained = before(read_records(run, "preempt", scenario.world_size), position)
    resumed = read_records(run, "resume", scenario.world_size)
    for rank, expected in full.items():
        assert steps_of(trained[rank] + resumed[rank]) == steps_of(expected), f"rank {rank} after {what}"


# ------------------------------------------------------------------------------- the preemption matrix
EXIT_BOUND_S = float(os.environ.get("E2E_PREEMPTION_EXIT_BOUND_S", "20"))
"""From the signal to the last process of the run gone: a few seconds (Lightning's teardown, the save, the
workers' shutdown, the interpreter's exit) and one batch, on 2 busy cores."""
CPU_SHARES = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
"""The pytest processes that share the machine's cores (pytest-xdist's workers, as CI runs them; 1 without)."""
SPAWN_EXIT_BOUND_S = 2 * EXIT_BOUND_S * CPU_SHARES
"""The same for workers started by spawn: a worker still starting when its loader shuts it down (Lightning starts
the train loader's before the train start, where a signal held since setup ends the fit) is waited for until it
has imported torch and Lightning anew, its own and its rank's peers' on the same 2 cores (docs/operating.md): CPU
time, so with another test's runs on those cores, its share of them (soak seeds 289129377 and 630113956 under
``-n 2``: 4 spawned workers a rank, ended 41.7 s and 56.9 s after the signal)."""
HANG_AFTER_SIGNAL_S = max(60.0, SPAWN_EXIT_BOUND_S + 20)
"""A run with a process left this long after its signal hangs: its stacks are printed and it is killed."""
PREEMPTION_WHENS = ("setup", "sanity", "train_start", "step", "batch", "validation", "save", "workers_start")
"""Where `train.Preempt` sends its signal: in the callback's ``setup`` (before the restore), in the sanity check,
at the train start (the first loaders' workers forked, nothing trained), during a training step or at its end,
inside a validation, inside a checkpoint save, and while the next epoch's loader workers start (from a worker
just forked; with no workers, at that epoch's start)."""
SLURM_STUB = '''#!{python}
"""scontrol as SLURM's: ``requeue JOB`` is recorded, then the job is terminated (SIGTERM to every process of the
step, here the process group this stub runs in), as slurmctld does to a requeued job before it starts again."""
import json, os, signal, sys, time
with open({calls!r}, "a") as calls:
    calls.write(json.dumps(sys.argv[1:]) + "\\n")
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open({signalled!r}, "w") as signalled:
    signalled.write(json.dumps({{"at": time.monotonic(), "when": "requeued", "pid": os.getpid()}}))
os.killpg(os.getpgrp(), signal.SIGTERM)
'''


@dataclass(frozen=True)
class Preemption:
    """How a run is preempted (`train.Preempt`): ``signal`` (``TERM``; ``USR1``: SLURM's requeue signal in a SLURM
    job step, the requeue then terminating the job with SIGTERM) to ``target`` at the first point of kind ``when``
    at or after batch ``at``; ``resumed_first``: the preempted run resumes a run stopped there (a checkpoint at the
    end of that batch), so the signal lands in the first epoch after a resume; ``launcher``: ``fork`` (the fork
    server, as an external launcher starts the ranks), ``lightning`` (``python train.py``, Lightning's launcher
    starting the other ranks) or ``torchrun``, the last two whole processes that end by Python's own exit;
    ``sanity_steps``: the preempted run's sanity check; ``again``: a second signal, ``at_once`` (right after the
    first), ``while_ending`` (as the exception path's checkpoint is written) or ``kill_while_saving`` (SIGKILL
    a moment after that save began: SLURM's, after its KillWait; a checkpoint is then whole or absent, and the
    last periodic one resumes)."""

    signal: str = "TERM"
    target: str = "group"
    when: str = "batch"
    at: tuple[int, int] = (0, 2)
    resumed_first: tuple[int, int] | None = None
    launcher: str = "fork"
    sanity_steps: int = 0
    again: str | None = None
    resumed_on: tuple[int, int, int] | None = None
    """The requeue lands on another allocation (issue 55): the resume's (world size, workers, batch size)."""

    def label(self) -> str:
        first = "" if self.resumed_first is None else f"-after-resume@{self.resumed_first[0]}.{self.resumed_first[1]}"
        target = self.target.replace(" ", "_")
        again = "" if self.again is None else f"-again-{self.again}"
        moved = (
            "" if self.resumed_on is None else "-resumed-on-{}x{}w{}".format(*self.resumed_on[::2], self.resumed_on[1])
        )
        return (
            f"SIG{self.signal}-to-{target}-{self.when}@{self.at[0]}.{self.at[1]}{first}{again}{moved}-{self.launcher}"
        )


@dataclass
class PreemptedRun:
    """What a preemption case measured: the seconds from the signal to the last process gone, and the problems
    (empty: it ended cleanly and resumed exactly)."""

    exit_s: float | None
    problems: list[str]


def _leg_config(run: Path, phase: str, scenario: Scenario, previous: Path | None, **extra: Any) -> Path:
    values = {
        **asdict(scenario),
        "phase": phase,
        "out_dir": str(run),
        "first_world_size": scenario.world_size,
        "checkpoint": str(run / f"{phase}.ckpt"),
        "stop": {"kind": "none", "epoch": -1, "batch": -1},
        "resume_from": None if previous is None else str(previous),
        **extra,
    }
    path = run / f"{phase}.json"
    path.write_text(json.dumps(values))
    return path


def _run_leg(run: Path, phase: str, scenario: Scenario, previous: Path | None, **extra: Any) -> None:
    path, log = _leg_config(run, phase, scenario, previous, **extra), run / f"{phase}.log"
    code = fork_server().run(path, scenario.world_size, log, run, RUN_TIMEOUT_S, f"{scenario.label()} {phase}")
    assert code == 0, f"{scenario.label()} {phase} exited {code}:\n{log.read_text()[-4000:]}"


def _kept_at(run: Path, phase: str, world_size: int, checkpoint: Path) -> tuple[Records, Records]:
    """Per rank, the steps and validations of ``phase`` that a resume from ``checkpoint`` (written by it) keeps:
    what the rank had recorded at the save that wrote it, which the checkpoint names (`train.StepRecorder.
    on_save_checkpoint`)."""
    save = int(torch.load(checkpoint, weights_only=False, map_location="cpu")["e2e_save"])
    steps, validations = read_records(run, phase, world_size), read_validations(run, phase, world_size)
    for rank in range(world_size):
        saves = [json.loads(line) for line in (run / f"{phase}.saves.rank{rank}.jsonl").read_text().splitlines()]
        (saved,) = [each for each in saves if each["save"] == save]
        steps[rank], validations[rank] = steps[rank][: saved["steps"]], validations[rank][: saved["validations"]]
    return steps, validations


def run_preemption(
    runner: Runner,
    scenario: Scenario,
    preemption: Preemption,
    run: Path,
    elsewhere: Callable[[Runner, Outcome], list[str]] | None = None,
) -> PreemptedRun:
    """Run ``scenario`` preempted as ``preemption`` says, then resume its checkpoint to the end; compare every
    rank's steps (ids, content, loss and parameter bits) and validations with the uninterrupted run's, or, resumed on
    another allocation (``preemption.resumed_on``), judge the run by ``elsewhere`` (the matrix's judge of such a
    case, given the stop's epoch and the resume's layout).

    A case that reads MosaicML Streaming runs alone among such cases on this machine (`_mosaic_alone`).

    Raises:
        AssertionError: a run hung (every process's stack printed) or a leg failed.
    """
    with _mosaic_alone(scenario):
        return _preempted_run(runner, scenario, preemption, run, elsewhere)


@contextlib.contextmanager
def _mosaic_alone(scenario: Scenario) -> Iterator[None]:
    """Hold a machine-wide lock while a case over Mosaic's shards runs (its ``mosaic`` or ``sharded-mixture`` data).

    Mosaic names its shared-memory blocks by the first free prefix, and a killed run's processes unlink theirs by name
    as they die: a run on the other pytest-xdist worker that took the prefix meanwhile (its first block already gone)
    lost its ``000000_barrier`` to them, and its workers, started by forkserver, could not open it (CI, data libraries'
    preemption seed 7, while seed 0's preempted processes were ending). Two such cases never overlap now. (A lock of its
    own: the runs' rank 0 takes `train.one_mosaic_registration_at_a_time`'s.)"""
    if scenario.data not in ("mosaic", "sharded-mixture"):
        yield
        return
    import fcntl
    import tempfile

    with open(Path(tempfile.gettempdir()) / "lightning-resumable-tests-mosaic-preemptions.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _preempted_run(
    runner: Runner,
    scenario: Scenario,
    preemption: Preemption,
    run: Path,
    elsewhere: Callable[[Runner, Outcome], list[str]] | None,
) -> PreemptedRun:
    full, full_validations = runner.full(scenario), runner.full_validations(scenario)
    world_size = scenario.world_size
    run.mkdir(parents=True, exist_ok=True)
    steps: Records = {rank: [] for rank in range(world_size)}
    validations: Records = {rank: [] for rank in range(world_size)}
    previous: Path | None = None
    if preemption.resumed_first is not None:  # a first run, stopped by a save at the end of that batch
        epoch, batch = preemption.resumed_first
        stop = {"kind": "batch_end", "epoch": epoch, "batch": batch, "val_batch": 1}
        _run_leg(run, "first", scenario, None, stop=stop, leg={"kind": "batch_end"})
        previous = run / "first.ckpt"
        # Saved at that batch's end and ended there: every step and validation it recorded is before the save.
        steps, validations = read_records(run, "first", world_size), read_validations(run, "first", world_size)

    token = uuid.uuid4().hex  # in the environment of every process torchrun starts (fork-server runs share a group)
    extra: dict[str, Any] = {
        "preempt": {"signal": preemption.signal, "target": preemption.target, "when": preemption.when},
        "on_exception_checkpoint": True,
        "sanity_steps": preemption.sanity_steps,
    }
    extra["preempt"].update(at=list(preemption.at), again=preemption.again)
    env: dict[str, str] = {"PYTHONUNBUFFERED": "1", "E2E_RUN_TOKEN": token}
    scontrol_calls = run / "scontrol.calls"
    if preemption.signal == "USR1":  # a SLURM job step: Lightning's auto-requeue, scontrol a stub
        stub_bin = run / "bin"
        stub_bin.mkdir(exist_ok=True)
        stub = stub_bin / "scontrol"
        stub.write_text(
            SLURM_STUB.format(python=sys.executable, calls=str(scontrol_calls), signalled=str(run / "requeued.json"))
        )
        stub.chmod(0o755)
        env.update(
            PATH=f"{stub_bin}{os.pathsep}{os.environ['PATH']}",
            SLURM_JOB_ID=SLURM_JOB_ID,
            SLURM_JOB_NAME="train",
            SLURM_NTASKS=str(world_size),
            SLURM_NTASKS_PER_NODE=str(world_size),
            SLURM_NNODES="1",
            SLURM_NODEID="0",
            SLURM_NODELIST="localhost",
        )
    path, log = _leg_config(run, "preempt", scenario, previous, **extra), run / "preempt.log"
    what = f"{scenario.label()} preempted ({preemption.label()})"
    if preemption.launcher == "torchrun":
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}"]
        process: Any = processes.launch([*command, str(TRAIN_SCRIPT), str(path)], log, run, {**os.environ, **env})
    elif preemption.launcher == "lightning":  # python train.py: rank 0 starts the others (Lightning's launcher)
        process = processes.launch([sys.executable, str(TRAIN_SCRIPT), str(path)], log, run, {**os.environ, **env})
    else:
        process = fork_server().launch(path, world_size, log, run, env)
    started, sent = time.monotonic(), run / "preempt.signalled.json"

    def deadline() -> float:  # a run that has not ended a minute after the signal hangs
        return json.loads(sent.read_text())["at"] + HANG_AFTER_SIGNAL_S if sent.exists() else started + RUN_TIMEOUT_S

    try:
        gone_at = processes.wait_gone(process.pid, f"E2E_RUN_TOKEN={token}", deadline, what, run, log)
    finally:  # whatever failed, nothing of the run outlives the case
        for pid in processes.members_with(process.pid, f"E2E_RUN_TOKEN={token}"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait(timeout=RUN_TIMEOUT_S)  # reaped (the fork server answers once its leader has ended)
    problems: list[str] = []
    signalled = run / ("requeued.json" if preemption.signal == "USR1" else "preempt.signalled.json")
    if not (run / "preempt.signalled.json").exists():
        return PreemptedRun(None, [f"{what}: the signal was never sent; the log:\n{log.read_text()[-3000:]}"])
    if not signalled.exists():
        return PreemptedRun(None, [f"{what}: the job never asked to be requeued; the log:\n{log.read_text()[-3000:]}"])
    exit_s = gone_at - json.loads(signalled.read_text())["at"]
    bound = SPAWN_EXIT_BOUND_S if scenario.start_method.endswith("spawn") else EXIT_BOUND_S
    if exit_s > bound:
        problems.append(f"the processes ended {exit_s:.1f} s after the signal (bound {bound:.0f} s)")
    killed = preemption.again == "kill_while_saving"
    ended = {}
    for rank in range(world_size):
        record = run / f"preempt.ended.rank{rank}.json"
        ended[rank] = json.loads(record.read_text()) if record.exists() else {"exception": "no exception"}
    if any(each["exception"] != "SIGTERMException" for each in ended.values()):
        problems.append(f"not every rank ended through SIGTERMException: {ended}; log:\n{log.read_text()[-3000:]}")
    elif len({(each["epoch"], each["step"]) for each in ended.values()}) != 1:
        problems.append(f"the ranks ended at different batches: {ended}")
    checkpoint: Path | None = run / "on_exception.ckpt"
    if killed:  # written whole or not at all (Lightning writes through a temporary file): else the last periodic one
        assert checkpoint is not None
        if checkpoint.exists():
            torch.load(checkpoint, weights_only=False, map_location="cpu")  # whole: it loads
        else:
            checkpoint = run / "extra.ckpt" if (run / "extra.ckpt").exists() else previous
    elif preemption.signal == "USR1":
        calls = scontrol_calls.read_text().splitlines() if scontrol_calls.exists() else []
        if calls != [json.dumps(["requeue", SLURM_JOB_ID])]:
            problems.append(f"scontrol was called {calls}, not once to requeue")
        checkpoint = run / "hpc_ckpt_1.ckpt"  # the requeued job resumes from Lightning's HPC checkpoint
    if checkpoint is not None and not checkpoint.exists():
        problems.append(f"no checkpoint {checkpoint.name}; the log:\n{log.read_text()[-3000:]}")
    if problems:
        return PreemptedRun(exit_s, problems)
    if checkpoint is None or checkpoint == previous:  # killed before any save of its own: the run before resumes
        preempted = kept_validations = {rank: [] for rank in range(world_size)}
    else:
        preempted, kept_validations = _kept_at(run, "preempt", world_size, checkpoint)
    if preemption.resumed_on is not None and elsewhere is not None:  # the requeue on another allocation
        resume_world_size, resume_workers, resume_batch_size = preemption.resumed_on
        moved = replace(
            scenario, world_size=resume_world_size, num_workers=resume_workers, batch_size=resume_batch_size
        )
        _run_leg(run, "end", moved, checkpoint)
        stopped = {rank: steps[rank] + preempted[rank] for rank in range(world_size)}
        stop_epoch = max((record["epoch"] for records in stopped.values() for record in records), default=0)
        judged = replace(
            scenario,
            stop_epoch=stop_epoch,
            resume_world_size=resume_world_size,
            resume_num_workers=resume_workers,
            resume_batch_size=resume_batch_size,
        )
        resumed = read_records(run, "end", resume_world_size)
        return PreemptedRun(exit_s, elsewhere(runner, Outcome(judged, full, stopped, resumed)))
    _run_leg(run, "end", scenario, checkpoint)  # (a phase named "resume..." reads its own checkpoint path)
    resumed, resumed_validations = read_records(run, "end", world_size), read_validations(run, "end", world_size)
    fields = [name for name in WITH_PARAMETERS if name != "batch"]  # (Lightning's numbering after resumes)
    for rank, expected in full.items():
        got = steps[rank] + preempted[rank] + resumed[rank]
        wanted = [{name: each.get(name) for name in fields} for each in expected]
        have = [{name: each.get(name) for name in fields} for each in got]
        if have != wanted:
            where = next((index for index, (w, h) in enumerate(zip(wanted, have, strict=False)) if w != h), None)
            problems.append(
                f"rank {rank}: {len(have)} steps, {len(wanted)} expected; first difference at step {where}"
                f" ({checkpoint.name})"
            )
        got_validations = validations[rank] + kept_validations[rank] + resumed_validations[rank]
        if got_validations != full_validations[rank]:
            problems.append(f"rank {rank}: validations {got_validations}, expected {full_validations[rank]}")
    return PreemptedRun(exit_s, problems)
