"""Preemption: a SIGTERM mid-epoch, as SLURM, a spot-instance notice or a Kubernetes eviction sends it,
goes through Lightning's own signal handling; ``OnExceptionCheckpoint`` saves from the exception path.
The run must end (no rank waits forever: a timeout kills the tree and prints every stack) and its
checkpoint must resume exactly: after it, every rank trains what the uninterrupted run trained from
that checkpoint's position, ids, augmentations and losses (2 DDP processes, 2 workers each), for a
map-style loader and for a user's stream (whose state is per rank: the ranks capture it together where
they act on the signal), and inside a gradient accumulation window (the signal is acted on at its end)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from . import processes
from .harness import RUN_TIMEOUT_S, TRAIN_SCRIPT, Runner, Scenario, read_records
from .preemption import (
    PREEMPTION_TIMEOUT_S,
    SIGNAL_AT_STEP,
    SIGNALLED,
    SLURM_JOB_ID,
    STEP_SECONDS,
    Preemption,
    before,
    config,
    launch,
    preempt_and_resume,
    rank_pids,
    resume_and_compare,
    run_preemption,
    saved_position,
    steps_of,
    wait_for_steps,
)
from .processes import free_port

PREEMPTED = Scenario(world_size=2, num_workers=2, dataset_size=96, epochs=2)
"""12 batches per rank and epoch; the signal lands in epoch 0 or 1, mid-epoch."""
STREAMED = {workers: Scenario(world_size=2, num_workers=workers, data="stream", epochs=3) for workers in (0, 2)}
"""A user's stream sharded by rank and worker (`train.ShardedStream`): 6 batches per rank and epoch."""


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


@pytest.mark.parametrize("data", ["map", "mixture"])
def test_a_sigterm_to_the_whole_job_in_the_first_epoch_ends_cleanly_and_resumes_exactly(
    runner: Runner, tmp_path: Path, data: str
) -> None:
    """Issue 44's reproduction: 2 processes, 2 workers, the whole process group signalled (as SLURM and
    ``kill -TERM -- -PGID`` do) in the first epoch, whose workers forked before the train start: they died of
    it ("DataLoader worker ... is killed by signal"), and the ranks failed or hung. Every rank must end through
    ``SIGTERMException`` at one batch, every process go, and the checkpoint resume exactly."""
    scenario = Scenario(world_size=2, num_workers=2, dataset_size=96, epochs=2, data=data)
    outcome = run_preemption(runner, scenario, Preemption(target="group", when="step", at=(0, 3)), tmp_path / "run")
    assert outcome.problems == []


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
