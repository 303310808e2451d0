"""End to end (2 DDP processes): LitData, which users stream with. Runs where ``litdata`` is installed
(CI's extras step); skipped elsewhere.

Controls show what plain Lightning does with LitData's own ``StreamingDataLoader`` (its state saved and
restored by Lightning); under the two lines, the same loader resumes exactly.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from .chains import Leg, run_chain
from .harness import Runner, Scenario, check_run_exits
from .matrix import elsewhere_mismatches, epoch_sequence, library_data_written

pytest.importorskip("litdata")

PLAIN = [
    Scenario(world_size=2, num_workers=workers, loader="StreamingDataLoader", data="litdata", resumable=False)
    for workers in (0, 2)
]


@pytest.fixture(scope="module")
def litdata_runner(runner: Runner) -> Runner:
    """The session's runner, with the chunks its LitData scenarios read written once."""
    library_data_written(runner, "litdata")
    return runner


def ids(steps: list[dict[str, Any]]) -> list[Any]:
    return [step["ids"] for step in steps]


@pytest.mark.parametrize("scenario", PLAIN, ids=lambda scenario: scenario.label())
def test_control_plain_lightning_with_litdatas_loader_replays_the_interrupted_epochs_tail(
    litdata_runner: Runner, scenario: Scenario
) -> None:
    """LitData resumes its own position in the interrupted epoch (Lightning saves its loader's state on
    rank 0, and every rank's is the same), but the augmentations, drawn from the global generators,
    differ from the first resumed step, and the next epoch reads the interrupted one's remaining
    batches again and ends after them (3 steps instead of 6 here)."""
    outcome = litdata_runner.run(scenario)
    epoch, stop = scenario.stop_epoch, scenario.stop_batch
    for rank, resumed in outcome.resumed.items():
        uninterrupted = [s for s in outcome.full[rank] if s["epoch"] == epoch and s["batch"] > stop]
        interrupted = [s for s in resumed if s["epoch"] == epoch]
        assert ids(interrupted) == ids(uninterrupted), f"rank {rank}: LitData's position is exact"
        assert interrupted[0]["aug"] != uninterrupted[0]["aug"], f"rank {rank}: augmentations are not"
        next_epoch = [s for s in resumed if s["epoch"] == epoch + 1]
        assert ids(next_epoch) == ids(interrupted) and len(next_epoch) < scenario.batches_per_epoch, f"rank {rank}"


EXACT = [replace(scenario, resumable=True) for scenario in PLAIN]
# A torch DataLoader over LitData's dataset crashed (its state_dict takes the loader's counts); it is
# read through LitData's loader.
EXACT.append(replace(EXACT[1], loader="DataLoader"))
# A CombinedStreamingDataset of two streams (LitData replays its choice of stream on a resume).
EXACT.append(replace(EXACT[0], data="litdata-combined"))
# Workers kept from pass to pass (issue 55): each reads the next pass from its own copy of the dataset, whose epoch
# LitData moves on as the worker runs out; an epoch cut by limit_train_batches leaves it behind (without new
# workers for the next pass, the runs differed at the resume).
EXACT.append(replace(EXACT[1], persistent_workers=True))
EXACT.append(replace(EXACT[1], persistent_workers=True, limit_train_batches=3))


@pytest.mark.parametrize("scenario", EXACT, ids=lambda scenario: scenario.label())
def test_litdatas_loader_resumes_exactly(litdata_runner: Runner, scenario: Scenario) -> None:
    """Under the two lines, LitData's StreamingDataLoader (or a torch DataLoader over its dataset)
    resumes each rank's ids, augmentations and loss bits at every step, and the next epoch is a whole
    fresh one."""
    outcome = litdata_runner.run(scenario)
    assert outcome.stream_mismatches() == []
    for rank, steps in outcome.full.items():
        assert len(steps) == scenario.batches_per_epoch * scenario.epochs, f"rank {rank}"


def test_control_litdatas_own_resume_on_one_process_does_not_train_the_interrupted_epoch_once(
    litdata_runner: Runner,
) -> None:
    """Plain Lightning with LitData's loader, stopped on 2 processes and resumed on 1 at the same global
    batch (4 -> 8 per process), LitData's own elastic resume: the interrupted epoch does not train each
    of its 48 samples once. The library resumes such an epoch in the order that began it instead
    (`test_litdatas_loader_resumed_on_another_layout_goes_on_in_the_interrupted_epochs_order`)."""
    scenario = replace(PLAIN[1], resume_world_size=1)
    epoch = scenario.stop_epoch
    stopped, resumed = litdata_runner.stopped(scenario), litdata_runner.resumed(scenario)
    trained = [
        i
        for run in (stopped, resumed)
        for steps in run.values()
        for s in steps
        if s["epoch"] == epoch
        for i in s["ids"]
    ]
    assert sorted(trained) != list(range(48)), "LitData's elastic resume trained the epoch's samples once each"


@pytest.mark.parametrize("workers", [0, 2])
def test_a_run_stopped_by_max_steps_exits_on_its_own(litdata_runner: Runner, workers: int) -> None:
    """A normal interpreter exit within a timeout, the loader's iterator not exhausted (`check_run_exits`)."""
    check_run_exits(
        litdata_runner.root, Scenario(world_size=2, num_workers=workers, loader="StreamingDataLoader", data="litdata")
    )


ELSEWHERE = [
    replace(EXACT[1], resume_world_size=1),  # 2 -> 1 process, the global batch kept (4 -> 8 each)
    replace(EXACT[1], world_size=1, resume_world_size=2),  # 1 -> 2 processes (4 -> 2 each)
    replace(EXACT[1], resume_num_workers=0),  # 2 workers -> none
    # Batches of 4 -> 8 on the same 2 processes: the new layout's epoch holds 3 batches, the checkpoint's count (soak
    # seed 422241577: the resumed epoch was counted in the new layout's units, looked over, and started afresh).
    replace(EXACT[1], resume_batch_size=8),
    replace(EXACT[1], resume_num_workers=3, resume_batch_size=6),  # 2 -> 3 workers, batches of 4 -> 6
    replace(EXACT[1], persistent_workers=True, resume_batch_size=2),  # a ramp down, workers kept
    replace(EXACT[1], stop_kind="last_batch", resume_world_size=1),  # at an epoch's end: the next one is fresh
    # ... whose length on the new layout differs (soak seed 132127177: the next epoch ran the ended one's 6 batches)
    replace(EXACT[1], stop_kind="last_batch", resume_world_size=1, resume_num_workers=0, resume_batch_size=2),
    replace(EXACT[1], stop_kind="validation", resume_num_workers=1, resume_batch_size=8),  # at a validation
]


ORDERED = [ELSEWHERE[index].declaring_its_order() for index in (0, 4, 7, 8)]
"""Issue 55, one order whatever the layout: the dataset declares the first launch's layout as its order, and the
resumes of `ELSEWHERE` (2 -> 1 process; 2 -> 3 workers with batches of 6; at an epoch's last batch 2 x 2 -> 1 x 0
with batches of 2; at a validation, 1 worker and batches of 8) read the interrupted epoch and every later one in it."""


@pytest.mark.parametrize("scenario", ORDERED, ids=lambda scenario: scenario.label())
def test_litdatas_loader_declaring_its_order_reads_every_epoch_in_it_on_another_layout(
    litdata_runner: Runner, scenario: Scenario
) -> None:
    assert elsewhere_mismatches(litdata_runner, litdata_runner.run(scenario)) == []


@pytest.mark.parametrize("scenario", ELSEWHERE, ids=lambda scenario: scenario.label())
def test_litdatas_loader_resumed_on_another_layout_goes_on_in_the_interrupted_epochs_order(
    litdata_runner: Runner, scenario: Scenario
) -> None:
    """Issue 55: the interrupted epoch's samples go on in the global order the first layout would have trained them
    (the rest of its sequence, dealt in global batches of the new layout; a last uneven one padded from the rest's
    start), each with its augmentation; the next epochs are what a fresh run of the new layout reads."""
    assert elsewhere_mismatches(litdata_runner, litdata_runner.run(scenario)) == []


def test_an_epoch_resumed_on_another_layout_resumes_again_on_a_third(litdata_runner: Runner) -> None:
    """A chain: 2 processes with 2 workers stopped in epoch 1; resumed on 1 process (batches of 8) and stopped one
    batch later, inside the epoch it continues (its checkpoint holds the first layout and the global position);
    resumed on 2 processes without workers. The interrupted epoch trains in the uninterrupted run's global order,
    and the next epoch is a fresh run's of the last layout."""
    scenario = EXACT[1]
    legs = [
        Leg("batch_end", epoch=1, batch=1),
        Leg("batch_end", epoch=1, batch=2, world_size=1),
        Leg("end", num_workers=0),
    ]
    steps, _ = run_chain(litdata_runner.root / "litdata-three-layouts", scenario, legs)
    expected, trained = epoch_sequence(litdata_runner.full(scenario), 1), epoch_sequence(steps, 1)
    assert trained[: len(expected)] == expected and len(trained) - len(expected) < 8
    fresh = litdata_runner.full(replace(scenario, num_workers=0))
    assert [record["ids"] for record in steps[0] if record["epoch"] == 2] == [
        record["ids"] for record in fresh[0] if record["epoch"] == 2
    ]
