"""Crash soak: a 2-process run checkpointing every k steps (and ``last.ckpt``) is killed with SIGKILL
at seeded random steps, 5 times, each time resumed from ``last.ckpt``, then trains to the end. Its
audit log (every step it ran, re-runs after each kill included) must equal, step for step and rank by
rank, the uninterrupted run's. And a SIGTERM to one rank goes through Lightning's own signal handling;
the run resumes from ``last.ckpt`` exactly.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from lightning_resumable.format.audit import first_divergence, read_audit

from . import processes
from .harness import FORK, RUN_TIMEOUT_S, TRAIN_SCRIPT, Scenario, fork_server

CHECKPOINT_EVERY = 6
STEP_SECONDS = 0.05  # a kill lands within a step of where it is aimed, far from a checkpoint write
SOAK = Scenario(world_size=2, num_workers=2, dataset_size=96, epochs=2)


def config(run: Path, phase: str, **extra: Any) -> Path:
    values = {
        **asdict(SOAK),
        "phase": phase,
        "out_dir": str(run),
        "checkpoint": str(run / "unused.ckpt"),
        "stop": {"kind": "none", "epoch": -1, "batch": -1},
        "val_check_interval": 1.0,
        "audit_dir": str(run / "audit"),
        "checkpoint_every": CHECKPOINT_EVERY,
        "checkpoint_dir": str(run / "checkpoints"),
        "step_seconds": STEP_SECONDS,
        **extra,
    }
    path = run / f"{phase}.json"
    path.write_text(json.dumps(values))
    return path


def launch(run: Path, phase: str, **extra: Any) -> Any:
    """A run in its own process group, so that a kill reaches every rank and worker (a ``Popen``, or the
    fork server's leader: both ``poll``, ``wait`` and name the group by ``pid``), from the fork server
    unless ``E2E_FORK_SERVER=0``."""
    run.mkdir(parents=True, exist_ok=True)
    path, log = config(run, phase, **extra), run / f"{phase}.log"
    if FORK:
        return fork_server().launch(path, SOAK.world_size, log, run)
    return processes.launch([sys.executable, str(TRAIN_SCRIPT), str(path)], log, run)


def global_steps(run: Path, rank: int = 0) -> list[int]:
    """The global step each logged line of ``rank`` ended (batches per epoch times epoch, plus batch, plus 1)."""
    path = run / "audit" / f"audit.rank{rank}.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    steps = []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # being written
        steps.append(record["epoch"] * SOAK.batches_per_epoch + record["batch"] + 1)
    return steps


def wait_for_step(process: Any, run: Path, logged_before: int, target: int) -> None:
    """Poll rank 0's audit log until this launch has logged global step ``target``."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while target not in global_steps(run)[logged_before:]:
        if process.poll() is not None:
            raise AssertionError(f"the run ended before step {target}: {(run / 'soak.log').read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"step {target} not reached in {RUN_TIMEOUT_S} s")
        time.sleep(0.01)  # polling a file, not waiting out a race


def finish(process: Any, run: Path, phase: str) -> int:
    return processes.wait_tree(process, RUN_TIMEOUT_S, phase, run, run / f"{phase}.log")


def test_five_kills_at_random_steps_train_what_an_uninterrupted_run_trains(tmp_path: Path) -> None:
    full = tmp_path / "full"
    assert finish(launch(full, "full"), full, "full") == 0
    total = SOAK.epochs * SOAK.batches_per_epoch

    soak, chooser, resume_from, kills = tmp_path / "soak", random.Random(20261130), None, []
    for _ in range(5):
        logged_before = len(global_steps(soak))
        resumed_at = global_steps(soak)[-1] if kills else 0  # not exact: where the last checkpoint is
        process = launch(soak, "soak", **({"resume_from": resume_from} if resume_from else {}))
        # A seeded random step past the next checkpoint, half-way between two checkpoints.
        checkpoints_ahead = chooser.randint(1, 2)
        target = (resumed_at // CHECKPOINT_EVERY + checkpoints_ahead) * CHECKPOINT_EVERY + CHECKPOINT_EVERY // 2
        target = min(target, total - CHECKPOINT_EVERY // 2)
        wait_for_step(process, soak, logged_before, target)
        processes.kill_tree(process)  # a real crash: SIGKILL, no exception, no cleanup
        kills.append(target)
        resume_from = str(soak / "checkpoints" / "last.ckpt")
    assert finish(launch(soak, "soak", resume_from=resume_from), soak, "soak") == 0

    assert len(kills) == 5
    logged = global_steps(soak)
    assert len(logged) > total, "steps after each checkpoint were trained again"
    assert set(logged) == set(range(1, total + 1)), "every step of the uninterrupted run was trained"
    # Every step, re-runs included, read the ids that step read uninterrupted, on every rank.
    assert first_divergence(read_audit(full / "audit"), read_audit(soak / "audit")) is None


def test_sigterm_to_the_launching_rank_goes_through_lightning_and_resumes_exactly(tmp_path: Path) -> None:
    """A scheduler's SIGTERM to rank 0, which launched the other rank: the callback holds it until the
    end of a batch, where the ranks agree on it; both stop there through Lightning's SIGTERMException,
    and the run resumes from ``last.ckpt`` exactly."""
    full, run = tmp_path / "full", tmp_path / "run"
    assert finish(launch(full, "full", num_workers=0), full, "full") == 0
    process = launch(run, "soak", num_workers=0)
    wait_for_step(process, run, 0, CHECKPOINT_EVERY + CHECKPOINT_EVERY // 2)
    os.kill(process.pid, signal.SIGTERM)
    finish(process, run, "soak")  # Lightning 2.6.6 stops the fit and exits 0
    log = (run / "soak.log").read_text()
    assert "[rank: 0] lightning_resumable: SIGTERM received here" in log, log[-3000:]
    assert "[rank: 1] lightning_resumable: SIGTERM received by another rank" in log, log[-3000:]
    trained = global_steps(run)
    assert trained[-1] < SOAK.epochs * SOAK.batches_per_epoch, "the run stopped before its end"
    resume_from = str(run / "checkpoints" / "last.ckpt")
    assert finish(launch(run, "soak", num_workers=0, resume_from=resume_from), run, "soak") == 0
    assert first_divergence(read_audit(full / "audit"), read_audit(run / "audit")) is None
