"""End to end: a real ``lightning.Trainer`` (DDP, gloo, CPU) stopped mid-epoch and resumed is exact.

Every scenario trains three ways: straight through; stopped right after saving a checkpoint (the
process ends with ``os._exit``); resumed from that checkpoint. Per rank, the steps completed before
the stop followed by the resumed steps must equal the uninterrupted steps, bit for bit: epoch, batch
index, sample ids, each sample's augmentation values (drawn from torch, ``random`` and NumPy) and
the loss (the model has dropout). The controls run the same harness without the library, or with
one of its seedings turned off, and must see exactly the difference that the missing part causes,
which shows the comparison can tell a wrong run from a right one.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from .harness import Outcome, Runner, Scenario, run_phase
from .pairwise import all_pairs, pairs_of, pairwise
from .train import subset_of, weights_of

DIMENSIONS: dict[str, list[object]] = {
    "stop_kind": ["batch_end", "last_batch", "in_step", "validation", "est_steps"],
    "world_size": [1, 2, 3],
    "num_workers": [0, 2],
    "loader": ["DataLoader", "StatefulDataLoader"],
    "shuffle": [True, False],
    "drop_last": [False, True],
    "persistent_workers": [False, True],
}
ROWS = pairwise(DIMENSIONS, shareable="stop_kind")


def scenario_of(row: dict[str, object]) -> Scenario:
    values = dict(row)
    estimated = values["stop_kind"] == "est_steps"
    if estimated:
        values["stop_kind"] = "batch_end"
    return Scenario(estimated_stepping_batches=estimated, **values)  # type: ignore[arg-type]


SCENARIOS = [scenario_of(row) for row in ROWS]
# The same scenarios without the library wherever plain Lightning breaks: DDP with shuffle. A plain
# DataLoader saved on the last batch resumes right in plain Lightning (the next epoch starts afresh),
# so that one is no control.
CONTROLS = [
    replace(s, resumable=False)
    for s in SCENARIOS
    if s.world_size > 1 and s.shuffle and not (s.stop_kind == "last_batch" and s.loader == "DataLoader")
]


def row_of(scenario: Scenario) -> dict[str, object]:
    """The dimension values a scenario that is run really has (read back from it, not from its row)."""
    row: dict[str, object] = {name: getattr(scenario, name) for name in DIMENSIONS if name != "stop_kind"}
    row["stop_kind"] = "est_steps" if scenario.estimated_stepping_batches else scenario.stop_kind
    return row


def test_the_scenarios_run_cover_every_pair_of_dimension_values_in_fewer_runs_than_all() -> None:
    covered = set().union(*(pairs_of(row_of(scenario), list(DIMENSIONS)) for scenario in SCENARIOS))
    assert covered == all_pairs(DIMENSIONS), sorted(all_pairs(DIMENSIONS) - covered)[:5]
    assert len(SCENARIOS) < len(list(itertools.product(*DIMENSIONS.values()))) / 10


def test_pairwise_finds_a_minimal_covering_array_of_three_binary_dimensions() -> None:
    rows = pairwise({"a": [0, 1], "b": [0, 1], "c": [0, 1]})
    assert len(rows) == 4  # the known minimum; the full product has 8


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.label() for s in SCENARIOS])
def test_resumed_stream_equals_uninterrupted_stream(runner: Runner, scenario: Scenario) -> None:
    outcome = runner.run(scenario)
    assert outcome.stream_mismatches() == []
    assert outcome.validation_mismatches(runner) == []
    assert_each_epoch_covers_the_dataset(outcome)


def test_three_processes_resume_ids_and_augmentations_bit_for_bit_and_losses_to_their_last_bits(
    runner: Runner,
) -> None:
    """The scenario where DDP's reordered gradient sum first showed (rank 1, epoch 2, batch 1: one ulp)."""
    scenario = Scenario(world_size=3, num_workers=2, shuffle=False, drop_last=True, stop_kind="in_step")
    outcome = runner.run(scenario)
    assert outcome.stream_mismatches(fields=("epoch", "batch", "ids", "aug")) == []
    assert outcome.stream_mismatches() == []


@pytest.mark.parametrize("scenario", CONTROLS, ids=[s.label() for s in CONTROLS])
def test_control_without_the_library_is_detected_as_wrong(runner: Runner, scenario: Scenario) -> None:
    outcome = runner.run(scenario)
    assert outcome.stream_mismatches() != []
    assert outcome.differing_fields() & {"ids", "steps"}, "plain Lightning gets the data wrong"


# The setup (2 processes, 2 workers, shuffle) with one kind of seeding turned off.
SEEDING_CONTROLS = {
    name: (difference, Scenario(world_size=2, num_workers=2, callback_options=((name, False),)))
    for name, difference in [("seed_samples", {"aug", "loss"}), ("seed_steps", {"loss"})]
}


@pytest.mark.parametrize("turned_off", list(SEEDING_CONTROLS))
def test_control_without_one_seeding_differs_in_exactly_what_it_seeds(runner: Runner, turned_off: str) -> None:
    """Same ids either way; without per-sample seeds the augmentations (and so the losses) differ,
    without per-step seeds only the losses (dropout masks) do."""
    expected_difference, scenario = SEEDING_CONTROLS[turned_off]
    assert runner.run(scenario).differing_fields() == expected_difference


def test_a_dataset_with_its_own_state_resumes_exactly(runner: Runner) -> None:
    """A curriculum level raised at each epoch's end is persisted once and restored before the first batch."""
    outcome = runner.run(Scenario(world_size=2, num_workers=2, curriculum=True))
    assert outcome.stream_mismatches() == []
    levels = {level for records in outcome.resumed.values() for record in records for level in record["level"]}
    assert levels == {1, 2}, "the resumed run trains at the levels the interrupted run had reached"


@pytest.mark.parametrize("sampler", ["weighted", "replacement", "num_samples", "subset", "bucketing"])
def test_each_standard_sampler_resumes_exactly(runner: Runner, sampler: str) -> None:
    scenario = Scenario(world_size=2, num_workers=2, sampler=sampler)
    outcome = runner.run(scenario)
    assert outcome.stream_mismatches() == []
    trained = [i for records in outcome.full.values() for record in records for i in record["ids"]]
    if sampler == "weighted":
        assert not {i for i in trained if weights_of(scenario.dataset_size)[i] == 0}, "a zero weight was drawn"
    if sampler == "subset":
        assert set(trained) == set(subset_of(scenario.dataset_size)), "only the subset, all of it"
    if sampler == "bucketing":
        assert len({len(record["ids"]) for records in outcome.full.values() for record in records}) > 1
    if sampler == "num_samples":
        assert len(trained) == scenario.epochs * (scenario.dataset_size + 13 + 1)  # one sample of padding


def test_a_dataloader_subclass_resumes_exactly(runner: Runner) -> None:
    """Built again by its own class through Lightning's re-instantiation, with its own arguments."""
    outcome = runner.run(Scenario(world_size=2, num_workers=2, loader="TaggedLoader"))
    assert outcome.stream_mismatches() == []


def test_a_dataset_relisted_before_the_resume_is_refused_before_any_step_trains(runner: Runner) -> None:
    scenario = Scenario(world_size=2, num_workers=2, relist_on_resume=True)
    resumed = runner.resumed(scenario, expect_failure=True)
    assert resumed == {0: [], 1: []}, "a resumed step trained on the changed data"
    log = next(runner.root.joinpath(scenario.label()).glob("resume-*.log")).read_text()
    assert "ResumeVerificationError" in log
    # Raised on every rank (none is left waiting in a collective), naming each saving rank.
    assert "rank 0: it has the same sample keys but different content" in log
    assert "rank 1: it has the same sample keys but different content" in log


def test_drawn_seed_is_agreed_by_ranks_saved_and_reused(tmp_path: Path) -> None:
    """Without seed_everything the seed is drawn once; the resume must continue that very order."""
    unseeded = Scenario(world_size=2, seed=None)
    run_dir = tmp_path / "unseeded"
    checkpoint = run_dir / "stop.ckpt"
    stopped = run_phase(unseeded, "stop", run_dir, checkpoint)
    saved = torch.load(checkpoint, weights_only=True)["callbacks"]["ResumableDataCallback"]["state"]["train"]
    resumed = run_phase(unseeded, "resume", run_dir, checkpoint)
    # The uninterrupted reference: the same data order, now chosen by seed_everything(saved seed).
    reference_dir = tmp_path / "reference"
    full = run_phase(Scenario(world_size=2, seed=saved["seed"]), "full", reference_dir, reference_dir / "x.ckpt")
    outcome = Outcome(unseeded, full, stopped, resumed)
    # The model's initial weights were drawn unseeded, so only what the data gives can be compared.
    assert outcome.stream_mismatches(fields=("epoch", "batch", "ids", "aug")) == []
    assert_each_epoch_covers_the_dataset(outcome)


def test_checkpoint_loads_with_weights_only_and_holds_plain_values(runner: Runner) -> None:
    scenario = next(s for s in SCENARIOS if s.stop_kind == "in_step" and s.world_size == 3)
    runner.run(scenario)  # already run above: the runner returns the recorded outcome
    checkpoint = runner.checkpoint(scenario)
    state = torch.load(checkpoint, weights_only=True)["callbacks"]["ResumableDataCallback"]["state"]
    assert json.loads(json.dumps(state)) == state
    assert (state["train"]["world_size"], state["train"]["epoch"]) == (3, scenario.stop_epoch)
    assert len(state["next_batch"]) == 3, "every rank's fingerprint reaches the checkpoint"
    assert len({tuple(fingerprint) for fingerprint in state["next_batch"]}) == 3
    # Inside training_step of the stop batch only the batches before it are done, on each of the 3 ranks.
    assert state["train"]["position"] == scenario.stop_batch * scenario.batch_size * 3


def assert_each_epoch_covers_the_dataset(outcome: Outcome) -> None:
    """Ranks agree on the order: within an epoch they partition the dataset (up to the documented tail)."""
    scenario = outcome.scenario
    for epoch in range(scenario.epochs):
        ids = [
            sample
            for rank_records in outcome.full.values()
            for record in rank_records
            if record["epoch"] == epoch
            for sample in record["ids"]
        ]
        distinct = set(ids)
        if scenario.drop_last:
            assert len(distinct) == len(ids), f"epoch {epoch}: a sample was trained twice"
        else:
            assert distinct == set(range(scenario.dataset_size)), f"epoch {epoch}: samples missing"
        if scenario.shuffle and epoch > 0:
            previous = [r["ids"] for r in itertools.chain(*outcome.full.values()) if r["epoch"] == epoch - 1]
            current = [r["ids"] for r in itertools.chain(*outcome.full.values()) if r["epoch"] == epoch]
            assert previous != current, "consecutive epochs have the same order"
