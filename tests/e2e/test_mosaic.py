"""End to end (2 DDP processes): MosaicML Streaming, which users stream with. Runs where ``streaming``
is installed (CI's extras step, with a stand-in for torchvision: `train.import_streaming`); skipped
elsewhere.

Every run builds the dataset after `lightning_resumable.set_mosaic_environment` (Lightning's launcher
sets neither ``RANK`` nor ``LOCAL_WORLD_SIZE``, which Mosaic reads). A control shows what plain
Lightning does with Mosaic's own ``StreamingDataLoader`` (its state saved and restored by Lightning);
under the two lines, the same loader resumes exactly.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from . import train
from .chains import Leg, run_chain
from .harness import Outcome, Runner, Scenario, check_run_exits, resume_damaged, stream_state
from .matrix import (
    global_batch_mismatches,
    global_steps,
    library_data_written,
    regrouped_mismatches,
    regrouping_problems,
)
from .preemption import preempt_and_resume

if importlib.util.find_spec("streaming") is None:
    pytest.skip("MosaicML Streaming is not installed", allow_module_level=True)

PLAIN = Scenario(world_size=2, num_workers=2, loader="StreamingDataLoader", data="mosaic", resumable=False)


@pytest.fixture(scope="module")
def mosaic_runner(runner: Runner) -> Runner:
    """The session's runner, with the shards its Mosaic scenarios read written once."""
    library_data_written(runner, "mosaic")  # Mosaic's leftovers cleaned (a stopped run leaves its own)
    return runner


def ids(steps: list[dict[str, Any]]) -> list[Any]:
    return [step["ids"] for step in steps]


def test_control_plain_lightning_with_mosaics_loader_resumes_ids_but_not_augmentations(mosaic_runner: Runner) -> None:
    """Mosaic resumes its own position in the interrupted epoch (Lightning saves its loader's state on
    rank 0, a global sample count), but the augmentations, drawn from the global generators, differ
    from the first resumed step."""
    outcome = mosaic_runner.run(PLAIN)
    epoch, stop = PLAIN.stop_epoch, PLAIN.stop_batch
    for rank, resumed in outcome.resumed.items():
        uninterrupted = [s for s in outcome.full[rank] if s["epoch"] == epoch and s["batch"] > stop]
        interrupted = [s for s in resumed if s["epoch"] == epoch]
        assert ids(interrupted) == ids(uninterrupted), f"rank {rank}: Mosaic's position is exact"
        assert interrupted[0]["aug"] != uninterrupted[0]["aug"], f"rank {rank}: augmentations are not"


EXACT = [replace(PLAIN, resumable=True, num_workers=workers) for workers in (0, 2)]
# A torch DataLoader over Mosaic's dataset crashed (its state_dict takes the loader's counts); it is
# read through Mosaic's loader.
EXACT.append(replace(EXACT[1], loader="DataLoader"))
# Mosaic's order does not depend on the number of workers: 2 workers resume on none.
EXACT.append(replace(EXACT[1], resume_num_workers=0))
# Workers kept from pass to pass (issue 55): the epoch each sample's seed is keyed by is shared with them (with a
# copy of the first pass's, the resume's first batch differed from the uninterrupted run's), epochs cut or not.
EXACT.append(replace(EXACT[1], persistent_workers=True))
EXACT.append(replace(EXACT[1], persistent_workers=True, limit_train_batches=3, resume_num_workers=0))


@pytest.mark.parametrize("scenario", EXACT, ids=lambda scenario: scenario.label())
def test_mosaics_loader_resumes_exactly(mosaic_runner: Runner, scenario: Scenario) -> None:
    """Under the two lines, Mosaic's StreamingDataLoader (or a torch DataLoader over its dataset)
    resumes each rank's ids, augmentations and loss bits at every step, and every epoch is whole."""
    outcome = mosaic_runner.run(scenario)
    assert outcome.stream_mismatches() == []
    for rank, steps in outcome.full.items():
        assert len(steps) == scenario.batches_per_epoch * scenario.epochs, f"rank {rank}"


def test_a_run_on_two_processes_resumes_on_one_at_the_same_global_batch(mosaic_runner: Runner) -> None:
    """2 -> 1 processes, batch 4 -> 8 per process: every later step trains the very samples, with their
    augmentations, that the two ranks trained together at that step of the uninterrupted run (Mosaic
    partitions its global count again; each sample's seed is its own), and the interrupted epoch ends
    after the same number of steps."""
    scenario = replace(EXACT[1], resume_world_size=1)
    full, stopped = global_steps(mosaic_runner.full(scenario)), global_steps(mosaic_runner.stopped(scenario))
    resumed = global_steps(mosaic_runner.resumed(scenario))
    assert list(stopped) + list(resumed) == list(full)
    assert {**stopped, **resumed} == full
    outcome = mosaic_runner.run(scenario)
    assert global_batch_mismatches(outcome) == [], "the matrix's judge of the same promise"
    cut = Outcome(scenario, outcome.full, outcome.stopped, {0: outcome.resumed[0][1:]})
    assert global_batch_mismatches(cut), "the judge finds a step not trained"


REGROUPED = [
    replace(EXACT[1], resume_batch_size=8),  # a batch-size ramp on the same 2 processes: global batch 8 -> 16
    replace(EXACT[1], resume_world_size=1, resume_batch_size=6),  # 2 x 4 -> 1 x 6, workers kept from pass to pass
]
REGROUPED[1] = replace(REGROUPED[1], persistent_workers=True)


@pytest.mark.parametrize("scenario", REGROUPED, ids=lambda scenario: scenario.label())
def test_a_resume_on_another_global_batch_goes_on_through_the_same_global_sequence(
    mosaic_runner: Runner, scenario: Scenario
) -> None:
    """Another batch size (issue 55), on the same or another world size: Mosaic's global sequence goes on from the
    checkpoint's count in global batches of the new size, each sample with its augmentation, and the interrupted
    epoch ends when it has trained them all (Lightning counts its batches on from the checkpoint's: its length is
    the batches before the stop and the rest's); the next epochs are a fresh run's of the new layout."""
    outcome = mosaic_runner.run(scenario)
    assert regrouped_mismatches(mosaic_runner, outcome) == []
    epoch, resumed = scenario.stop_epoch, outcome.resumed[0]
    first = min(step["batch"] for step in resumed if step["epoch"] == epoch)
    assert first == scenario.stop_batch + 1, "Lightning's count goes on from the checkpoint's"
    cut = Outcome(scenario, outcome.full, outcome.stopped, {0: [s for s in resumed if s["batch"] != first + 1]})
    assert regrouped_mismatches(mosaic_runner, cut), "the judge finds a step not trained"


def test_an_epoch_resumed_on_another_global_batch_resumes_again_on_a_third(mosaic_runner: Runner) -> None:
    """A chain: 2 processes of 4 stopped in epoch 1 after 2 batches; resumed with batches of 8 and stopped one batch
    later, inside the epoch it continues (its checkpoint counts the samples consumed, not batches of one size);
    resumed on 1 process of 8 without workers. The interrupted epoch goes through the uninterrupted run's global
    sequence, and the next epoch is a fresh run's of the last layout (Lightning counted it anew)."""
    scenario = EXACT[1]
    legs = [
        Leg("batch_end", epoch=1, batch=1),
        Leg("batch_end", epoch=1, batch=2, config=(("batch_size", 8),)),
        Leg("end", world_size=1, num_workers=0),  # 4 x 2 // 1: batches of 8, the global batch of the first leg
    ]
    steps, _ = run_chain(mosaic_runner.root / "mosaic-three-layouts", scenario, legs)
    by_step = global_steps(steps)
    full = [pairs for (epoch, _), pairs in sorted(global_steps(mosaic_runner.full(scenario)).items()) if epoch == 1]
    chain = [pairs for (epoch, _), pairs in sorted(by_step.items()) if epoch == 1]
    assert [len(pairs) for pairs in chain] == [8, 8, 16, 8, 8], "2 steps of 8 samples, 1 of 16, 2 of 8"
    assert regrouping_problems(full, chain, "epoch 1") == []
    fresh = global_steps(mosaic_runner.full(replace(scenario, world_size=1, batch_size=8, num_workers=0)))
    assert {step: pairs for step, pairs in by_step.items() if step[0] == 2} == {
        step: pairs for step, pairs in fresh.items() if step[0] == 2
    }


@pytest.mark.parametrize("scenario", [replace(EXACT[1], resume_world_size=1), REGROUPED[0]], ids=("2to1", "batch4to8"))
def test_a_resume_on_another_layout_checks_the_global_batch_sample_by_sample(
    mosaic_runner: Runner, tmp_path: Path, scenario: Scenario
) -> None:
    """On another world size or batch size no rank's next batch is one a saving rank recorded, but the global batch
    is (or holds it, or is part of it): each saving rank recorded a digest of each sample of its next batch, and the
    resumed ranks' first samples together must be those. One digest edited (2 -> 1 processes; batches of 4 -> 8) is
    refused on the resume before any step trains; the checkpoint as written resumes (the tests above)."""
    (tmp_path / train.MOSAIC_DIR).symlink_to(mosaic_runner.root / train.MOSAIC_DIR)  # the run reads shards beside it

    def edit(checkpoint: dict[str, Any]) -> None:
        samples = stream_state(checkpoint)["next_samples"]
        assert [len(each) for each in samples] == [scenario.batch_size] * scenario.world_size
        samples[1][0] = "0" * 16

    log = resume_damaged(mosaic_runner, scenario, tmp_path, edit)
    assert "ResumeVerificationError: the first global batch after the checkpoint" in log, log[-3000:]
    assert f"1 of the {scenario.batch_size * scenario.world_size} samples of the checkpoint" in log


def test_a_resume_on_another_world_size_is_refused_when_the_callback_forbids_it(mosaic_runner: Runner) -> None:
    """``ResumableDataCallback(allow_world_size_change=False)`` holds for a stream whose position is
    global (Mosaic's), as for a map-style loader: 2 -> 1 processes is refused on the resume, naming the
    option, before any step trains."""
    options = (("allow_world_size_change", False),)
    scenario = replace(EXACT[1], resume_world_size=1, callback_options=options)
    mosaic_runner.stopped(scenario)
    resumed = mosaic_runner.resumed(scenario, expect_failure=True)
    assert resumed == {0: []}
    log = (mosaic_runner.root / scenario.label() / "resume-on-1-attempt1.log").read_text()
    assert "WorldSizeChangedError" in log and "allow_world_size_change=False" in log, log[-3000:]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_preempted_mosaic_stream_ends_and_resumes_exactly(
    mosaic_runner: Runner, tmp_path: Path, workers: int
) -> None:
    """A data library's stream under preemption: SIGTERM to every rank, ``OnExceptionCheckpoint``; the ranks
    capture Mosaic's state where they act on the signal, and the resume is exact. With workers, the
    preempted run's read-ahead iterator once left workers that never exited (the run hung after its
    checkpoint): every iterator Mosaic's loader made is retired at the end of the fit now."""
    (tmp_path / train.MOSAIC_DIR).symlink_to(mosaic_runner.root / train.MOSAIC_DIR)  # the run reads shards beside it
    preempt_and_resume(mosaic_runner, tmp_path / "run", EXACT[0 if workers == 0 else 1], "every rank")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_run_stopped_by_max_steps_exits_on_its_own(mosaic_runner: Runner, workers: int) -> None:
    """A normal interpreter exit within a timeout, the loader's iterator not exhausted (`check_run_exits`)."""
    check_run_exits(
        mosaic_runner.root, Scenario(world_size=2, num_workers=workers, loader="StreamingDataLoader", data="mosaic")
    )
