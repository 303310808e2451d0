"""End to end: a ``Mixture`` of named sources (a real ``Trainer``, DDP on gloo, 2 processes, 2 workers).

A resume with unchanged weights is the uninterrupted run. A resume with other weights (or sources
added and removed) is the uninterrupted run whose schedule changes at the step the checkpoint was
written: per rank and step, the same sample ids, augmentations and loss bits, and the same
validations. A schedule that changes by itself resumes exactly from either side of its change. A
resume on one process continues the stream of two: the samples of all ranks in stream order, with
their augmentations, are the uninterrupted two-process run's with the same change.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from . import processes
from .data_setups import MIXTURE_SOURCES
from .harness import RUN_TIMEOUT_S, Outcome, Runner, Scenario, stream_order

FIRST = (("a", 5), ("b", 3), ("c", 2))
SHIFTED = (("a", 1), ("b", 1), ("c", 6))
BASE = Scenario(world_size=2, num_workers=2, data="mixture", mixture_weights=((0, FIRST),))
STEPS_AT_STOP = BASE.stop_epoch * BASE.batches_per_epoch + BASE.stop_batch + 1
"""Training steps completed when the stopped run's checkpoint is written (epoch 1, after its batch 2)."""


def compared(runner: Runner, scenario: Scenario, reference: Scenario) -> Outcome:
    """The scenario stopped and resumed, against the uninterrupted run of ``reference``."""
    return Outcome(scenario, runner.full(reference), runner.stopped(scenario), runner.resumed(scenario))


def assert_exact(runner: Runner, outcome: Outcome) -> None:
    assert outcome.stream_mismatches() == []
    assert outcome.validation_mismatches(runner) == []


def test_unchanged_weights_resume_exactly(runner: Runner) -> None:
    outcome = runner.run(BASE)
    assert_exact(runner, outcome)
    sources = {sample // 1000 for records in outcome.full.values() for record in records for sample in record["ids"]}
    assert sources == {0, 1, 2}, "every source is drawn"


def test_workers_kept_from_pass_to_pass_resume_exactly(runner: Runner) -> None:
    """``persistent_workers=True`` (Lightning's advice for loaders with workers)."""
    assert_exact(runner, runner.run(replace(BASE, persistent_workers=True)))


@pytest.mark.parametrize("stop_kind", ["last_batch", "in_step", "validation"])
def test_a_checkpoint_at_an_epochs_end_inside_a_step_or_at_a_validation_resumes_exactly(
    runner: Runner, stop_kind: str
) -> None:
    """The epoch boundary of a mixture's stream (the next epoch starts where this one's whole batches end)."""
    assert_exact(runner, runner.run(replace(BASE, stop_kind=stop_kind)))


def test_weights_changed_at_a_resume_equal_a_schedule_that_changes_there(runner: Runner) -> None:
    changed = replace(BASE, resume_mixture_weights=((0, SHIFTED),))
    reference = replace(BASE, mixture_weights=((0, FIRST), (STEPS_AT_STOP, SHIFTED)))
    outcome = compared(runner, changed, reference)
    assert outcome.stream_mismatches() == []
    unchanged, scheduled = runner.full(BASE), outcome.full
    pairs = [pair for rank in unchanged for pair in zip(unchanged[rank], scheduled[rank], strict=True)]
    assert any(old["ids"] != new["ids"] for old, new in pairs), "the new weights draw another stream than the old"


@pytest.mark.parametrize("switch", [STEPS_AT_STOP + 3, STEPS_AT_STOP - 3], ids=["saved-before", "saved-after"])
def test_a_scheduled_change_resumes_exactly_from_a_checkpoint_on_either_side_of_it(runner: Runner, switch: int) -> None:
    scheduled = replace(BASE, mixture_weights=((0, FIRST), (switch, SHIFTED)))
    assert_exact(runner, runner.run(scheduled))


def test_a_source_added_and_one_removed_equal_a_run_whose_weights_change_there(runner: Runner) -> None:
    sources_after = (("a", 19), ("b", 11), ("d", 13))
    changed = replace(
        BASE, resume_mixture_sources=sources_after, resume_mixture_weights=((0, (("a", 5), ("b", 3), ("d", 2))),)
    )
    every_source = (*MIXTURE_SOURCES, ("d", 13))
    reference = replace(
        BASE,
        mixture_sources=every_source,
        mixture_weights=(
            (0, (*FIRST, ("d", 0))),
            (STEPS_AT_STOP, (("a", 5), ("b", 3), ("c", 0), ("d", 2))),
        ),
    )
    outcome = compared(runner, changed, reference)
    assert outcome.stream_mismatches() == []
    after = [sample for records in outcome.resumed.values() for record in records for sample in record["ids"]]
    assert {sample // 1000 for sample in after} == {0, 1, 3}, "the new source is drawn, the removed one is not"


def test_a_resume_on_one_process_with_other_weights_continues_the_stream_of_two(runner: Runner) -> None:
    changed = replace(BASE, resume_world_size=1, resume_mixture_weights=((0, SHIFTED),))
    reference = runner.full(replace(BASE, mixture_weights=((0, FIRST), (STEPS_AT_STOP, SHIFTED))))
    interrupted = stream_order(runner.stopped(changed)) + stream_order(runner.resumed(changed))
    expected = stream_order(reference)
    assert len(interrupted) == len(expected), "the epochs hold whole global batches on either world size"
    differing = [i for i, (got, want) in enumerate(zip(interrupted, expected, strict=True)) if got != want]
    assert not differing, f"stream position {differing[0]}: {interrupted[differing[0]]}, not {expected[differing[0]]}"


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mixture_schedule.py"


def test_the_mixture_example_resumes_with_new_weights_as_the_changed_schedule(tmp_path: Path) -> None:
    """``examples/mixture_schedule.py``: 2 processes, 2 workers, each run ending as a user's process does."""
    log = tmp_path / "example.log"
    code = processes.run_tree([sys.executable, str(EXAMPLE)], log, tmp_path, 3 * RUN_TIMEOUT_S, "the mixture example")
    output = log.read_text()
    assert code == 0 and "EXACT: the resumed run equals the run whose schedule changed there" in output, output[-4000:]
    for rank in range(2):
        assert (
            f"rank {rank}: 30 steps; the stopped and resumed run has the same ids in 30, augmentations in 30" in output
        )


def test_a_resume_on_two_processes_with_workers_continues_the_stream_of_one(runner: Runner) -> None:
    """1 -> 2 with workers, epochs of 2 batches a rank on two: the loader, rebuilt at the resumed epoch's
    end, is read to the end of the next epoch by the workers' prefetch before Lightning iterates it again
    (that epoch trained no batch before the fix). The per-rank batch is kept, so the global batch doubles
    and the epochs end elsewhere: compared over the stream positions both runs trained."""
    one = replace(BASE, world_size=1, batch_size=8, dataset_size=30)
    elastic = replace(one, resume_world_size=2)
    stopped, resumed = stream_order(runner.stopped(elastic)), stream_order(runner.resumed(elastic))
    expected = stream_order(runner.full(one))
    assert len(resumed) == 16 + 2 * 16, "the rest of the resumed epoch (one global batch), then a whole epoch"
    interrupted = stopped + resumed
    compared = min(len(interrupted), len(expected))
    assert interrupted[:compared] == expected[:compared]


@pytest.mark.parametrize("new_batch_size", [6, 2])
def test_a_resume_with_another_batch_size_continues_the_stream(runner: Runner, new_batch_size: int) -> None:
    """The mixture's stream goes on from the checkpoint's position in global batches of the new size: the samples
    of all ranks in stream order, with their augmentations, are the uninterrupted run's (its epochs, of whole
    global batches, end elsewhere: compared over the positions both runs trained)."""
    elastic = replace(BASE, resume_batch_size=new_batch_size)
    stopped, resumed = stream_order(runner.stopped(elastic)), stream_order(runner.resumed(elastic))
    expected = stream_order(runner.full(BASE))
    assert all(
        len(record["ids"]) <= new_batch_size for records in runner.resumed(elastic).values() for record in records
    )
    interrupted = stopped + resumed
    compared = min(len(interrupted), len(expected))
    assert compared > len(stopped) + 2 * new_batch_size
    assert interrupted[:compared] == expected[:compared]
