"""End to end: a mixture whose weights the training sets from its own per-source losses (a real ``Trainer``,
DDP on gloo, 2 processes).

Every 3 batches of an epoch the training takes an exponentiated-gradient step of the weights from each
source's mean loss over the global batch (`train.reweighted`), and every validation sets them too; with
gradient accumulation over 2 batches, so some changes are asked inside a window. Interrupted twice, by a
kill (the last periodic save resumes; the steps after it run again) and by SIGTERM on every rank (a
preemption: ``OnExceptionCheckpoint`` saves), the run equals the uninterrupted one per rank and step: sample
ids, augmentations, loss bits, parameters, the weights each step was drawn under, each change asked
(where, taking effect where, with which weights), and the validations with the changes asked in them.
The examples/online_mixing.py test adds 2 workers, a real SIGKILL and a real SIGTERM. A resume on one
process keeps the history: a change asked before the save takes effect where it would have.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from . import processes
from .chains import Leg
from .harness import RUN_TIMEOUT_S, Runner, Scenario, run_phase, stream_order
from .matrix import chain_problems

ONLINE = Scenario(
    world_size=2,
    data="mixture",
    dataset_size=72,  # 9 batches a rank an epoch: changes asked at batches 2, 5 and 8, and at 4 validations
    epochs=3,
    accumulate=2,
    extra_saves_every=2,  # optimizer steps: a killed leg resumes from the last of these saves
    online_mixing=3,
    online_in_validation=True,
)


def changes_in(records: dict[int, list[dict]]) -> list[dict]:
    return [record["asked"] for record in records[0] if record.get("asked")]


@pytest.mark.parametrize("workers", [0, 2], ids=["0-workers", "2-workers"])
def test_weights_set_by_the_training_resume_exactly_through_a_kill_and_a_sigterm(runner: Runner, workers: int) -> None:
    scenario = replace(ONLINE, num_workers=workers)
    legs = [Leg("kill", 0, 6, workers), Leg("sigterm", 1, 4, workers), Leg("end", num_workers=workers)]
    problems = chain_problems(runner, scenario, legs, runner.root / f"online-{scenario.label()}")
    assert problems == [], "\n".join(problems[:6])
    full, validations = runner.full(scenario), runner.full_validations(scenario)
    asked = changes_in(full)
    read_ahead = 1 + 2 * workers  # the trainer's one, and each worker's prefetch_factor (2)
    assert len(asked) == 9 and all(change["step"] >= change["asked"] + 1 + read_ahead for change in asked)
    assert any(change["asked"] % 2 == 0 for change in asked), "a change asked inside an accumulation window"
    assert all(change["step"] % 9 % 2 == 0 for change in asked), "each takes effect at a window's start"
    assert sum(1 for record in validations[0] if record.get("asked")) >= 8, "changes asked during validations"
    drawn = {tuple(sorted(record["weights"].items())) for record in full[0]}
    assert len(drawn) >= 6, f"the steps were drawn under {len(drawn)} weights only"


def test_a_resume_on_one_process_keeps_the_history_and_a_pending_change(runner: Runner) -> None:
    """Saved after batch 3 of epoch 1 (step 12), between the change asked at step 11 and the step it takes
    effect (13, the next window's first): the one-process run applies it there, and the stream up to the first
    change the resumed run asks is the uninterrupted two-process run's."""
    elastic = replace(ONLINE, stop_epoch=1, stop_batch_override=3, resume_world_size=1, online_in_validation=False)
    stopped, resumed = runner.stopped(elastic), runner.resumed(elastic)
    full = runner.full(replace(elastic, resume_world_size=None))
    pending = [change for change in changes_in(stopped) if change["step"] >= 13]
    assert pending, "a change asked before the save takes effect after it"
    assert resumed[0][0]["changes"] == stopped[0][-1]["changes"], "the history is kept"
    first_new = next(record["asked"] for record in resumed[0] if record.get("asked"))
    interrupted, expected = stream_order(stopped) + stream_order(resumed), stream_order(full)
    compared = first_new["position"]
    assert compared > pending[-1]["position"]
    assert interrupted[:compared] == expected[:compared]


def test_ranks_that_set_other_weights_are_refused_on_every_rank(runner: Runner, tmp_path: Path) -> None:
    """Rank 1 reweights from other losses than rank 0 (as from its own batch's, not all-reduced): every rank
    stops with WeightsDisagreementError at the first change, none trains on a mixture of its own."""
    scenario = replace(ONLINE, online_disagree=True, online_in_validation=False, accumulate=1, extra_saves_every=0)
    records = run_phase(scenario, "full", tmp_path, tmp_path / "unused.ckpt", expect_failure=True)
    log = (tmp_path / "full.log").read_text()
    assert log.count("WeightsDisagreementError: the ranks set the mixture's weights differently") >= 2, log[-3000:]
    assert all(len(steps) == 2 for steps in records.values()), "no rank trained past the step that asked"


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "online_mixing.py"


def test_the_online_mixing_example_is_exact_through_a_sigkill_and_a_sigterm(tmp_path: Path) -> None:
    """``examples/online_mixing.py``: 2 processes, 2 workers, real signals, each run ending as a user's does."""
    log = tmp_path / "example.log"
    code = processes.run_tree([sys.executable, str(EXAMPLE)], log, tmp_path, 4 * RUN_TIMEOUT_S, "the online example")
    output = log.read_text()
    assert code == 0 and "EXACT" in output, output[-4000:]
