"""The workflows around a resume, in a real 2-process DDP run: evaluating a checkpoint on the trainer
that then resumes it, gradient accumulation, and a changed ``drop_last``. Each compares per rank and
step the ids, augmentation values and losses with an uninterrupted run, or expects a refusal that
names the cause."""

from __future__ import annotations

import json

import pytest

from .harness import Runner, Scenario

BASE = Scenario(world_size=2, num_workers=2)  # shares its uninterrupted and stopped runs with other tests


def resume_log(runner: Runner, scenario: Scenario) -> str:
    return next(runner.root.joinpath(scenario.label()).glob("resume-*.log")).read_text()


def test_validate_test_and_predict_from_the_checkpoint_then_fit_on_the_same_trainer_resume_exactly(
    runner: Runner,
) -> None:
    """Before the fix, the validate's checkpoint load raised ResumeError on the fit that followed."""
    outcome = runner.run(Scenario(world_size=2, num_workers=2, evaluate_before_resume=True))
    assert outcome.stream_mismatches() == []


ACCUMULATING = Scenario(world_size=2, num_workers=2, dataset_size=64, epochs=2, accumulate=3)
"""8 batches per rank and epoch, the optimizer stepping after batches 2, 5 and 7 (the epoch's last)."""


def test_a_save_at_an_accumulation_boundary_resumes_exactly_losses_included(runner: Runner) -> None:
    outcome = runner.run(Scenario(**{**ACCUMULATING.__dict__, "stop_batch_override": 5}))
    assert outcome.stream_mismatches() == []


def test_a_save_inside_an_accumulation_window_is_refused_with_its_cause(runner: Runner) -> None:
    """Resumed, it trained exact ids but 15 of 17 losses differed: no accumulated gradient is saved."""
    scenario = Scenario(**{**ACCUMULATING.__dict__, "stop_batch_override": 3})
    resumed = runner.resumed(scenario, expect_failure=True)
    assert resumed == {0: [], 1: []}, "a resumed step trained"
    log = resume_log(runner, scenario)
    assert "PartialAccumulationError" in log
    assert "1 of accumulate_grad_batches=3 batches had been accumulated" in log


@pytest.mark.parametrize("saved", [False, True])
def test_a_resume_with_another_loader_drop_last_is_refused(runner: Runner, saved: bool) -> None:
    """It trained one partial batch more or fewer per epoch, with no error."""
    scenario = Scenario(world_size=2, num_workers=2, drop_last=saved, resume_drop_last=not saved)
    resumed = runner.resumed(scenario, expect_failure=True)
    assert resumed == {0: [], 1: []}, "a resumed step trained"
    log = resume_log(runner, scenario)
    assert "IncompatibleStateError" in log
    assert f"drop_last_batch: checkpoint {saved}, now {not saved}" in log


def test_fit_then_validate_test_and_predict_from_best_and_a_path_on_the_same_and_a_new_trainer(
    runner: Runner,
) -> None:
    """The tutorials' ending, after a resumed fit: before the fix, ``test(ckpt_path="best")`` on the trainer
    that fitted raised ResumeError ("the data state was restored after the train loader was built")."""
    scenario = Scenario(world_size=2, num_workers=2, evaluate_after_fit=True)
    outcome = runner.run(scenario)
    assert outcome.stream_mismatches() == []
    for rank in range(scenario.world_size):
        results = json.loads((runner.root / scenario.label() / f"evaluated.rank{rank}.json").read_text())
        for trainer in ("", "new "):
            which = "best" if trainer == "" else "path"
            assert set(results[f"{trainer}validate {which}"][0]) == {"val_loss"}, results
            assert set(results[f"{trainer}test {which}"][0]) == {"test_loss"}, results
            assert results[f"{trainer}predict path"] > 0, results
