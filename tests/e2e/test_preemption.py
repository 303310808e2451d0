"""Preemption: a SIGTERM mid-epoch, as SLURM, a spot-instance notice or a Kubernetes eviction sends it,
goes through Lightning's own signal handling; ``OnExceptionCheckpoint`` saves from the exception path.
The run must end (no rank waits forever: a timeout kills the tree and prints every stack) and its
checkpoint must resume exactly: after it, every rank trains what the uninterrupted run trained from
that checkpoint's position, ids, augmentations and losses (2 DDP processes, 2 workers each), for a
map-style loader and for a user's stream (whose state is per rank: the ranks capture it together where
they act on the signal), and inside a gradient accumulation window (the signal is acted on at its end)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import torch

from . import processes
from .harness import FIELDS, RUN_TIMEOUT_S, TRAIN_SCRIPT, Records, Runner, Scenario, read_records

PREEMPTED = Scenario(world_size=2, num_workers=2, dataset_size=96, epochs=2)
"""12 batches per rank and epoch; the signal lands in epoch 0 or 1, mid-epoch."""
STREAMED = {workers: Scenario(world_size=2, num_workers=workers, data="stream", epochs=3) for workers in (0, 2)}
"""A user's stream sharded by rank and worker (`train.ShardedStream`): 6 batches per rank and epoch."""
STEP_SECONDS = 0.05
SIGNAL_AT_STEP = {"map": 16, "stream": 8}
PREEMPTION_TIMEOUT_S = 120


def config(run: Path, phase: str, scenario: Scenario = PREEMPTED, **extra: Any) -> Path:
    values = {
        **asdict(scenario),
        "phase": phase,
        "out_dir": str(run),
        "checkpoint": str(run / "on_exception.ckpt"),
        "stop": {"kind": "none", "epoch": -1, "batch": -1},
        "val_check_interval": 1.0,
        "on_exception_checkpoint": True,
        **extra,
    }
    path = run / f"{phase}.json"
    path.write_text(json.dumps(values))
    return path


def launch(run: Path, phase: str, scenario: Scenario = PREEMPTED, **extra: Any) -> subprocess.Popen[bytes]:
    run.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(TRAIN_SCRIPT), str(config(run, phase, scenario, **extra))]
    return processes.launch(command, run / f"{phase}.log", run, {**os.environ, "PYTHONUNBUFFERED": "1"})


def wait_for_steps(process: subprocess.Popen[bytes], run: Path, steps: int) -> None:
    """Poll rank 0's step records until it has trained ``steps`` steps."""
    records, deadline = run / "preempt.rank0.jsonl", time.monotonic() + RUN_TIMEOUT_S
    while not records.exists() or len(records.read_text().splitlines()) < steps:
        assert process.poll() is None, f"the run ended early: {(run / 'preempt.log').read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"step {steps} not reached in {RUN_TIMEOUT_S} s"
        time.sleep(0.01)  # polling a file, not waiting out a race


def rank_pids(run: Path) -> list[int]:
    return [int((run / f"preempt.rank{rank}.pid").read_text()) for rank in range(PREEMPTED.world_size)]


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
    resumed_code = processes.run_tree(
        [sys.executable, str(TRAIN_SCRIPT), str(config(run, "resume", scenario))],
        run / "resume.log",
        run,
        RUN_TIMEOUT_S,
        "the resume",
    )
    assert resumed_code == 0, (run / "resume.log").read_text()[-3000:]
    trained = before(read_records(run, "preempt", scenario.world_size), position)
    resumed = read_records(run, "resume", scenario.world_size)
    for rank, expected in full.items():
        assert steps_of(trained[rank] + resumed[rank]) == steps_of(expected), f"rank {rank} after {what}"


@pytest.mark.parametrize("target", list(SIGNALLED))
def test_a_sigterm_mid_epoch_with_on_exception_checkpoint_ends_and_resumes_exactly(
    runner: Runner, tmp_path: Path, target: str
) -> None:
    preempt_and_resume(runner, tmp_path / "run", PREEMPTED, target)


@pytest.mark.parametrize(
    ("workers", "target"), [(0, "every rank"), (2, "every rank"), (2, "rank 0"), (2, "the process group")]
)
def test_a_preempted_stream_ends_and_resumes_exactly(runner: Runner, tmp_path: Path, workers: int, target: str) -> None:
    """A stream's position is per rank, so the exception path (where no rank may wait for another) used to
    write no state (MissingStateError on the resume): the ranks now capture every rank's stream state and
    next-batch digest together, at the batch end where they act on the signal."""
    preempt_and_resume(runner, tmp_path / "run", STREAMED[workers], target)


ACCUMULATED = {
    workers: Scenario(world_size=2, num_workers=workers, dataset_size=96, epochs=2, accumulate=3) for workers in (0, 2)
}
"""``accumulate_grad_batches=3``: a window ends after batches 3, 6, 9 and 12 of each epoch."""
SIGTERM_IN_STEP = [1, 1]
"""Each rank sends itself a SIGTERM inside the training step of epoch 1, batch 1: 2 of 3 batches of the
window accumulated when the ranks agree on it."""


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sigterm_inside_an_accumulation_window_is_acted_on_at_its_end(
    runner: Runner, tmp_path: Path, workers: int
) -> None:
    """Acted on at once, the signal wrote a checkpoint after 2 batches of epoch 1 that its resume refused
    (PartialAccumulationError); held to the window's end, the checkpoint is written after its third
    batch and resumes exactly."""
    scenario = ACCUMULATED[workers]
    full, run = runner.full(scenario), tmp_path / "run"
    process = launch(run, "preempt", scenario, sigterm_at=SIGTERM_IN_STEP)
    processes.wait_tree(process, PREEMPTION_TIMEOUT_S, "the run after a SIGTERM in a window", run, run / "preempt.log")
    checkpoint = run / "on_exception.ckpt"
    assert checkpoint.exists(), f"no checkpoint: {(run / 'preempt.log').read_text()[-3000:]}"
    assert saved_position(checkpoint) == (1, 3)
    assert "held for 1 batch" in (run / "preempt.log").read_text()
    resume_and_compare(full, run, scenario, (1, 3), "a SIGTERM inside an accumulation window")


# ------------------------------------------------------------------------------ SLURM auto-requeue
SLURM_JOB_ID = "4242"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def slurm_launch(
    run: Path, phase: str, stub_bin: Path, port: int, scenario: Scenario = PREEMPTED, **extra: Any
) -> subprocess.Popen[bytes]:
    """Both tasks of one SLURM job step on one node, as ``srun --ntasks=2`` starts them: Lightning finds
    a ``SLURMEnvironment`` (auto-requeue on SIGUSR1) and launches no process itself."""
    run.mkdir(parents=True, exist_ok=True)
    path = config(run, phase, scenario, on_exception_checkpoint=False, **extra)
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PATH": f"{stub_bin}{os.pathsep}{os.environ['PATH']}",
        "SLURM_JOB_ID": SLURM_JOB_ID,
        "SLURM_JOB_NAME": "train",
        "SLURM_NTASKS": "2",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_NNODES": "1",
        "SLURM_NODEID": "0",
        "SLURM_NODELIST": "localhost",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    tasks = " & ".join(
        f"SLURM_PROCID={rank} SLURM_LOCALID={rank} {shlex.quote(sys.executable)} {shlex.quote(str(TRAIN_SCRIPT))}"
        f" {shlex.quote(str(path))}"
        for rank in range(PREEMPTED.world_size)
    )
    return processes.launch(["sh", "-c", f"{tasks} & wait"], run / f"{phase}.log", run, env)


@pytest.mark.parametrize("data", ["map", "stream"])
def test_slurm_requeue_signal_saves_an_hpc_checkpoint_that_resumes_exactly(
    runner: Runner, tmp_path: Path, data: str
) -> None:
    """SLURM (``--signal=USR1@90``) sends SIGUSR1 to every task before the time limit. Lightning's
    handler saves ``hpc_ckpt_1.ckpt`` (collective) and runs ``scontrol requeue``; the requeued job
    (same ``default_root_dir``, no ``ckpt_path``) resumes from that checkpoint. Here ``scontrol`` is a
    stub that records its arguments, and the job is killed (SIGKILL) once it has asked for the requeue.
    For a map-style loader and for a user's stream (2 workers)."""
    scenario = PREEMPTED if data == "map" else STREAMED[2]
    full = runner.full(scenario)
    run, stub_bin = tmp_path / "run", tmp_path / "bin"
    stub_bin.mkdir()
    requeued = tmp_path / "scontrol.calls"
    scontrol = stub_bin / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {shlex.quote(str(requeued))}\n')
    scontrol.chmod(0o755)

    process = slurm_launch(run, "preempt", stub_bin, free_port(), scenario, step_seconds=STEP_SECONDS)
    try:
        wait_for_steps(process, run, SIGNAL_AT_STEP[data])
        for pid in rank_pids(run):
            os.kill(pid, signal.SIGUSR1)
        deadline = time.monotonic() + PREEMPTION_TIMEOUT_S
        while not requeued.exists():
            assert process.poll() is None, f"the job ended early: {(run / 'preempt.log').read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no requeue: {(run / 'preempt.log').read_text()[-3000:]}"
            time.sleep(0.01)  # polling a file, not waiting out a race
    finally:
        processes.kill_tree(process)  # SLURM ends the job after the signal's grace time
    assert requeued.read_text().split() == ["requeue", SLURM_JOB_ID]
    checkpoint = run / "hpc_ckpt_1.ckpt"
    assert checkpoint.exists(), sorted(path.name for path in run.iterdir())
    position = saved_position(checkpoint)
    assert (0, 0) < position < (scenario.epochs, 0), position

    resume = slurm_launch(run, "resume", stub_bin, free_port(), scenario, checkpoint=None)  # Lightning picks "hpc"
    code = processes.wait_tree(resume, RUN_TIMEOUT_S, "the requeued job", run, run / "resume.log")
    assert code == 0, (run / "resume.log").read_text()[-3000:]
    trained = before(read_records(run, "preempt", scenario.world_size), position)
    resumed = read_records(run, "resume", scenario.world_size)
    for rank, expected in full.items():
        assert steps_of(trained[rank] + resumed[rank]) == steps_of(expected), f"rank {rank} after the requeue"
