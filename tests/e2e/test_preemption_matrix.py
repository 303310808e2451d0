"""The preemption matrix: from one integer seed, a run preempted as a cluster does it (`matrix.draw_preemption`:
SIGTERM, or SLURM's requeue signal in a SLURM job step; to every rank, one rank, the whole process group with the
loader workers, or torchrun's agent; in setup, the sanity check, at the train start, in a step or at its end,
inside a validation, inside a checkpoint save, while the next epoch's workers start; in a fresh fit or the first
epoch after a resume; 0 or 2 workers; a map-style loader, a stream, a mixture, several loaders) must end on every
rank through Lightning's ``SIGTERMException`` at one batch, leave no process running past `EXIT_BOUND_S`, and
resume from its checkpoint exactly (ids, content, loss and parameter bits, validations).

CI runs `PREEMPTION_SEEDS`; a soak: ``E2E_MATRIX_SOAK=200 python -m pytest -m e2e
tests/e2e/test_preemption_matrix.py``. Each case's seconds from the signal to the last process gone are appended
to ``E2E_PREEMPTION_TIMES`` (a JSON line each), where that names a file: ``benchmarks/preemption_exit.py``
summarises them.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from .chains import LIBRARY_PREEMPTION_SEEDS
from .harness import Runner
from .matrix import (
    draw_library_preemption,
    draw_preemption,
    library_data_written,
    resumed_elsewhere_problems,
    seeds,
)
from .preemption import PREEMPTION_WHENS, Preemption, run_preemption

PREEMPTION_SEEDS = (0, 4, 7, 13, 14, 22, 27, 46, 49, 61, 66, 88, 97, 102, 148, 368, 321, 753)
"""The seeds CI runs: a cover of every signal, target, moment, second signal, launcher, kind of data, number of
workers and of processes the draw has (`test_the_seeds_cover_every_signal_target_and_moment`), with the group
signal in the first epoch after a resume (368), to a stream (97), under FSDP2 (88), inside an accumulation window
(49), on one process with workers (22), in a validation with the validation loader's workers (27) and the requeue
signal to the group in a step (148); workers started by forkserver given to the loaders (753), by forkserver as
the process default (7) and by spawn as the default (321: a Hugging Face stream; issue 54), the others by fork
(`matrix.FORK_IN_CI`). (157, spawn as the default and the requeue signal to the group, found the resource tracker
killed by that signal: `tests/test_worker_starts.py` reproduces it in seconds.) The table of
docs/guarantees.md#preemption lists them."""
REQUEUED_ELSEWHERE_SEEDS = (2000098, 5883)
"""Drawn preemptions of a Hugging Face stream requeued on another allocation (issue 55): SIGTERM to rank 1 while it
saves, after a first resume, 2 processes with 2 workers -> 2 without, batches of 8; SIGTERM to the process group in a
step of the first epoch, after a first resume, 2 processes -> 1 with batches of 6, the stream declaring the first
launch's layout as its order (the second epoch too in it)."""
WEB_DATASET_PREEMPTION_SEEDS = (21, 174, 257, 326, 226075957)
"""Drawn preemptions of a WebDataset pipeline (issue 46; CI's extras step): SLURM's requeue signal to rank 1 at a
step, 0 workers; SIGTERM to every rank as the next epoch's 2 workers start; SIGTERM to the group at the epoch's
last batch, after a first resume, 2 workers (found the epoch-end defect); SIGTERM to the group in a validation.
Requeued on another allocation (issue 55, a soak's): 226075957, the requeue signal to the group in a step, 2 x 2
workers -> 1 x 2."""


def _judged(runner: Runner, seed: int, drawn: tuple[object, Preemption], rerun: str) -> None:
    scenario, preemption = drawn
    where = f"seed {seed} ({scenario.label()}; {preemption.label()})"  # type: ignore[attr-defined]
    try:
        outcome = run_preemption(
            runner,
            scenario,  # type: ignore[arg-type]
            preemption,
            runner.root / f"preempt{seed}-{scenario.data}",  # type: ignore[attr-defined]
            resumed_elsewhere_problems,
        )
    except AssertionError as error:
        raise AssertionError(f"{where}: a run failed or hung; rerun: {rerun}\n{error}") from None
    times = os.environ.get("E2E_PREEMPTION_TIMES")
    if times and outcome.exit_s is not None:
        line = {"seed": seed, "exit_s": outcome.exit_s, "case": preemption.label(), "setup": scenario.label()}  # type: ignore[attr-defined]
        with Path(times).open("a") as file:
            file.write(json.dumps(line) + "\n")
    assert outcome.problems == [], f"{where}; rerun: {rerun}\n" + "\n".join(outcome.problems[:6])


@pytest.mark.parametrize("seed", seeds(fixed=PREEMPTION_SEEDS))
def test_a_drawn_preemption_ends_cleanly_and_resumes_exactly(runner: Runner, seed: int) -> None:
    rerun = f"E2E_MATRIX_SEEDS={seed} python -m pytest -m e2e tests/e2e/test_preemption_matrix.py -k drawn_preemption"
    drawn = draw_preemption(seed)
    if drawn[0].data == "wds" and importlib.util.find_spec("webdataset") is None:
        pytest.skip("webdataset is not installed (CI's extras step runs its cases)")
    _judged(runner, seed, drawn, rerun)


@pytest.mark.parametrize("seed", REQUEUED_ELSEWHERE_SEEDS)
def test_a_drawn_preemption_of_a_stream_requeued_on_another_allocation_resumes_in_its_order(
    runner: Runner, seed: int
) -> None:
    drawn = draw_preemption(seed)
    assert drawn[0].data == "hf" and drawn[1].resumed_on is not None
    rerun = f"E2E_MATRIX_SEEDS={seed} python -m pytest -m e2e tests/e2e/test_preemption_matrix.py -k drawn_preemption"
    _judged(runner, seed, drawn, rerun)


@pytest.mark.parametrize("seed", seeds(fixed=LIBRARY_PREEMPTION_SEEDS))
def test_a_drawn_preemption_of_a_data_librarys_loader_ends_cleanly_and_resumes_exactly(
    runner: Runner, seed: int
) -> None:
    scenario, preemption = draw_library_preemption(seed)
    needed = {"mosaic": ["streaming"], "sharded-mixture": ["litdata", "streaming"]}.get(scenario.data, ["litdata"])
    missing = [library for library in needed if importlib.util.find_spec(library) is None]
    if missing:
        pytest.skip(f"{missing} not installed")
    library_data_written(runner, scenario.data)
    rerun = f"E2E_MATRIX_SEEDS={seed} python -m pytest -m e2e tests/e2e/test_preemption_matrix.py -k library"
    _judged(runner, seed, (scenario, preemption), rerun)


def test_the_seeds_cover_every_signal_target_and_moment() -> None:
    drawn = [draw_preemption(seed)[1] for seed in PREEMPTION_SEEDS]
    assert {each.when for each in drawn} == set(PREEMPTION_WHENS)
    assert {each.target for each in drawn} == {"every rank", "rank 0", "rank 1", "group", "launcher"}
    assert {each.signal for each in drawn} == {"TERM", "USR1"}
    assert any(each.resumed_first is not None for each in drawn)
    assert {draw_preemption(seed)[0].data for seed in PREEMPTION_SEEDS} >= {"map", "stream", "mixture"}
    assert {draw_preemption(seed)[0].num_workers for seed in PREEMPTION_SEEDS} == {0, 2}
    started = {
        draw_preemption(seed)[0].start_method for seed in PREEMPTION_SEEDS if draw_preemption(seed)[0].num_workers
    }
    assert started == {"fork", "forkserver", "default:forkserver", "default:spawn"}  # (issue 54)


@pytest.mark.parametrize("seed", WEB_DATASET_PREEMPTION_SEEDS)
def test_a_drawn_preemption_of_a_web_dataset_ends_cleanly_and_resumes_exactly(runner: Runner, seed: int) -> None:
    pytest.importorskip("webdataset")
    drawn = draw_preemption(seed)
    assert drawn[0].data == "wds"
    _judged(runner, seed, drawn, f"python -m pytest -m e2e {__file__} -k 'web_dataset and {seed}'")


@pytest.mark.parametrize("data", ["stream", "hf"])
def test_a_stream_preempted_at_its_epochs_last_batch_resumes_the_next_epoch(runner: Runner, data: str) -> None:
    """A signal acted on at a stream's last batch of an epoch: Lightning's fit loop raises SIGTERMException after
    the epoch's end, and the checkpoint was written as the next epoch started with the ended epoch's batches, so
    the resume trained nothing in it (found by issue 46's preemptions of WebDataset streams, seed 257; a stream's
    unknown length hid the ended epoch from the loop-progress edit). Seed 257's draw with a stream of each kind."""
    scenario, preemption = draw_preemption(257)
    assert (preemption.when, preemption.at) == ("batch", (0, 4)), "the signal lands at the epoch's last batch but one"
    scenario = replace(scenario, data=data, shuffle_buffer=8 if data == "hf" else 0)
    _judged(runner, 257, (scenario, preemption), f"python -m pytest -m e2e {__file__} -k last_batch")
