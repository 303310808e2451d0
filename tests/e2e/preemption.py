"""Preempting a run of `train.py` as a cluster does, and resuming it: shared by the preemption tests."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from . import processes
from .harness import FIELDS, FORK, RUN_TIMEOUT_S, TRAIN_SCRIPT, Records, Runner, Scenario, fork_server, read_records

STEP_SECONDS = 0.05
SIGNAL_AT_STEP = {"map": 16, "stream": 8, "mosaic": 8}
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
