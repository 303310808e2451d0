"""End to end (a real ``Trainer``, DDP on gloo, 2 processes, 2 workers): the LLM pretraining data path.

A ``Mixture`` of LitData chunks, LitData token blocks (``TokensLoader``) and MosaicML Streaming shards,
each read chunk by chunk, and LitData's ``CombinedStreamingDataset(weights=..., iterate_over_all=False)``
in its ``StreamingDataLoader`` as users write it (read as the equivalent ``Mixture``): each resumes as
the uninterrupted run (ids, augmentations, loss and parameter bits, validations); with weights changed
at the resume, as the run whose schedule changed there; on another world size, in stream order. Runs
where ``litdata`` and ``streaming`` are installed (CI's extras step); skipped elsewhere.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from . import processes, train
from .chains import Leg, run_chain
from .harness import RUN_TIMEOUT_S, WITH_PARAMETERS, Outcome, Runner, Scenario, stream_order
from .matrix import library_data_written

pytest.importorskip("litdata")
if importlib.util.find_spec("streaming") is None:
    pytest.skip("MosaicML Streaming is not installed", allow_module_level=True)
train.import_streaming()

FIRST = (("a", 5), ("b", 3), ("c", 2))
SHIFTED = (("a", 1), ("b", 1), ("c", 6))
SHARDED = Scenario(world_size=2, num_workers=2, data="sharded-mixture", mixture_weights=((0, FIRST),))
STEPS_AT_STOP = SHARDED.stop_epoch * SHARDED.batches_per_epoch + SHARDED.stop_batch + 1
COMBINED_SOURCES = (("a", 19), ("b", 11))
COMBINED = Scenario(
    world_size=2,
    num_workers=2,
    data="litdata-weighted",
    loader="StreamingDataLoader",
    mixture_sources=COMBINED_SOURCES,
    mixture_weights=((0, (("a", 0.7), ("b", 0.3))),),
    dataset_size=30,  # the sources' sizes added up: what a Mixture of the same sources reads an epoch
)
COMBINED_STEPS_AT_STOP = COMBINED.stop_epoch * COMBINED.batches_per_epoch + COMBINED.stop_batch + 1


@pytest.fixture(scope="module")
def sharded_runner(runner: Runner) -> Runner:
    """The session's runner, with the sharded sources written once (and Mosaic's leftovers cleaned)."""
    library_data_written(runner, "sharded-mixture")  # Mosaic's leftovers cleaned
    return runner


def assert_exact(runner: Runner, outcome: Outcome) -> None:
    assert outcome.stream_mismatches(WITH_PARAMETERS) == []
    assert outcome.validation_mismatches(runner) == []


def assert_changed_as_scheduled(runner: Runner, changed: Scenario, reference: Scenario) -> Outcome:
    outcome = Outcome(changed, runner.full(reference), runner.stopped(changed), runner.resumed(changed))
    assert outcome.stream_mismatches() == []
    return outcome


def assert_in_stream_order(runner: Runner, elastic: Scenario, reference: Scenario) -> None:
    """The stopped and resumed runs' samples, in stream order, are the reference's: the per-rank batch is
    kept, so the global batch changes with the world size, and with it where the epochs end (each holds
    whole global batches): the runs are compared over the positions both trained."""
    stopped, resumed = stream_order(runner.stopped(elastic)), stream_order(runner.resumed(elastic))
    interrupted, expected = stopped + resumed, stream_order(runner.full(reference))
    assert len(resumed) >= elastic.batches_per_epoch * elastic.batch_size, "the resumed run trains a whole epoch"
    compared = min(len(interrupted), len(expected))
    differing = [
        i for i, (got, want) in enumerate(zip(interrupted[:compared], expected[:compared], strict=True)) if got != want
    ]
    assert not differing, f"stream position {differing[0]}: {interrupted[differing[0]]}, not {expected[differing[0]]}"


def test_a_mixture_of_litdata_token_and_mosaic_sources_resumes_exactly(sharded_runner: Runner) -> None:
    outcome = sharded_runner.run(SHARDED)
    assert_exact(sharded_runner, outcome)
    drawn = {sample // 1000 for records in outcome.full.values() for record in records for sample in record["ids"]}
    assert drawn == {0, 1, 2}, "every source is drawn: LitData chunks, token blocks, Mosaic shards"


def test_weights_changed_and_a_source_swapped_at_a_resume_equal_the_changed_schedule(sharded_runner: Runner) -> None:
    """``c`` (Mosaic) removed and ``d`` (LitData) added with new weights: the run whose schedule changed there."""
    after = (("a", 1), ("b", 2), ("d", 5))
    changed = replace(
        SHARDED, resume_mixture_sources=(("a", 19), ("b", 11), ("d", 13)), resume_mixture_weights=((0, after),)
    )
    reference = replace(
        SHARDED,
        mixture_sources=(("a", 19), ("b", 11), ("c", 7), ("d", 13)),
        mixture_weights=((0, (*FIRST, ("d", 0))), (STEPS_AT_STOP, (*after, ("c", 0)))),
    )
    outcome = assert_changed_as_scheduled(sharded_runner, changed, reference)
    resumed = {sample // 1000 for records in outcome.resumed.values() for record in records for sample in record["ids"]}
    assert resumed == {0, 1, 3}, "the new source is drawn, the removed one is not"


@pytest.mark.parametrize(("first", "then"), [(2, 1), (1, 2)], ids=["2to1", "1to2"])
def test_a_sharded_mixture_resumed_on_another_world_size_continues_the_stream(
    sharded_runner: Runner, first: int, then: int
) -> None:
    """2 -> 1 with the weights changed at the resume; 1 -> 2 with them unchanged."""
    base = replace(SHARDED, world_size=first, batch_size=SHARDED.batch_size * 2 // first)
    if then == 1:
        elastic = replace(base, resume_world_size=1, resume_mixture_weights=((0, SHIFTED),))
        reference = replace(base, mixture_weights=((0, FIRST), (STEPS_AT_STOP, SHIFTED)))
    else:
        elastic, reference = replace(base, resume_world_size=2), base
    assert_in_stream_order(sharded_runner, elastic, reference)


@pytest.mark.parametrize("kept", [False, True], ids=["workers anew", "persistent workers"])
def test_litdatas_combined_dataset_as_users_write_it_resumes_exactly(sharded_runner: Runner, kept: bool) -> None:
    assert_exact(sharded_runner, sharded_runner.run(replace(COMBINED, persistent_workers=kept)))


def test_litdatas_combined_dataset_with_other_weights_at_a_resume_on_one_process(sharded_runner: Runner) -> None:
    """Elastic (2 -> 1) and reweighted (0.7/0.3 -> 0.5/0.5): the stream of a ``Mixture`` of the same
    sources whose schedule changed there."""
    even = (("a", 0.5), ("b", 0.5))
    elastic = replace(COMBINED, resume_world_size=1, resume_mixture_weights=((0, even),))
    reference = replace(
        COMBINED,
        data="sharded-mixture",
        loader="DataLoader",
        mixture_weights=((0, COMBINED.mixture_weights[0][1]), (COMBINED_STEPS_AT_STOP, even)),
    )
    assert_in_stream_order(sharded_runner, elastic, reference)


def test_litdatas_combined_dataset_resumed_on_two_processes_continues_the_stream(sharded_runner: Runner) -> None:
    one = replace(COMBINED, world_size=1, batch_size=COMBINED.batch_size * 2)
    assert_in_stream_order(sharded_runner, replace(one, resume_world_size=2), one)


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llm_mixture.py"


def test_the_llm_example_resumes_at_new_weights_as_the_changed_schedule(tmp_path: Path) -> None:
    """``examples/llm_mixture.py``: LitData's weighted ``CombinedStreamingDataset`` of two token datasets, 2
    processes, 2 workers, stopped mid-epoch and resumed at 0.5/0.5; each run ends as a user's process does."""
    log = tmp_path / "example.log"
    code = processes.run_tree([sys.executable, str(EXAMPLE)], log, tmp_path, 3 * RUN_TIMEOUT_S, "the LLM example")
    output = log.read_text()
    assert code == 0 and "EXACT: the resumed run equals the run whose schedule changed there" in output, output[-4000:]
    for rank in range(2):
        assert (
            f"rank {rank}: 30 steps; the stopped and resumed run has the same blocks in 30, loss bits in 30" in output
        )
    assert output.count("after it: web 0.50, code 0.50") == 2, output[-2000:]


def test_a_chunked_mixture_rolled_back_with_skips_equals_the_run_given_them_from_the_start(
    sharded_runner: Runner,
) -> None:
    """Issue 47 on the LLM data path: LitData chunks, token blocks and Mosaic shards read chunk by chunk; steps 3-6
    (across epoch 0's end) skipped at a resume from step 2, the recovered run killed and resumed: it trains what a
    run given the skip from the start trains (ids, augmentations, loss and parameter bits, validations)."""
    scenario = replace(SHARDED, epochs=3, extra_saves_every=2)
    skipping = (("callback_options", [("skip_steps", "3-6")]),)
    root = sharded_runner.root  # the sources are read from the run directory's parent
    reference = run_chain(root / "skips-sharded-reference", scenario, [Leg("end", config=skipping)])
    legs = [
        Leg("batch_end", epoch=0, batch=1),
        Leg("kill", epoch=1, batch=1, config=skipping),
        Leg("end", config=skipping),
    ]
    steps, validations = run_chain(root / "skips-sharded-recovered", scenario, legs)
    assert steps == reference[0] and validations == reference[1]
    assert all(len(each) == 3 * SHARDED.batches_per_epoch for each in steps.values())  # a mixture's epochs keep length
