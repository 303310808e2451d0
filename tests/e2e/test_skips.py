"""Loss-spike recovery, end to end on 2 processes: a run rolled back to a checkpoint and resumed with
``skip_steps`` trains, step for step, what a reference run given the same skips from the start trains (ids,
augmentation values, loss bits, validations), also after a further kill and resume of the recovered run; and
the audit logs of both compare identical. A range before the checkpoint's step is refused before any step."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from lightning_resumable import Mixture, OrderUnknownError, WeightSchedule
from lightning_resumable.format.audit import first_divergence, read_audit
from lightning_resumable.tools.step_batches import step_batches

from . import processes
from .chains import Leg, run_chain
from .data_setups import MIXTURE_OFFSETS
from .harness import RUN_TIMEOUT_S, Runner, Scenario, read_records
from .train import OffsetDataset

SKIPPED = ((3, 6), (9, 10))
"""Steps as the spiking run numbers them: 5 batches a rank and epoch, so 3-6 crosses the end of epoch 0 (its
batches 3 and 4, epoch 1's 0 and 1) and 9-10 the end of epoch 1 (its batch 4, epoch 2's 0)."""
SKIPS = ",".join(f"{first}-{last}" for first, last in SKIPPED)
FIRST = (("a", 5), ("b", 3), ("c", 2))
SHIFTED = (("a", 1), ("b", 1), ("c", 6))
CASES = {
    "map": Scenario(world_size=2, epochs=3, extra_saves_every=2),
    # The schedule changes at steps 5 and 10, each inside a range: as the stream counts steps, skipped ones included.
    "mixture": Scenario(
        world_size=2,
        epochs=3,
        extra_saves_every=2,
        data="mixture",
        mixture_weights=((0, FIRST), (5, SHIFTED), (10, FIRST)),
    ),
    "stream": Scenario(world_size=2, epochs=3, extra_saves_every=2, data="stream"),
    "hf": Scenario(world_size=2, epochs=3, extra_saves_every=2, data="hf", shuffle_buffer=8),
}
"""A map-style loader (each epoch a permutation, so a skip shortens its epochs: 5 batches a rank), a mixture with
a schedule by steps (one stream: its epochs keep their length, the stream goes on after a skip; 5 batches), a
user's stream and a Hugging Face stream shuffled through a buffer (read and discarded; 6 batches)."""


def skipping(scenario: Scenario, audit: Path) -> tuple[tuple[str, object], ...]:
    return (("callback_options", [*scenario.callback_options, ("skip_steps", SKIPS)]), ("audit_dir", str(audit)))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("data", sorted(CASES))
def test_a_run_rolled_back_and_resumed_with_skips_equals_the_run_given_them_from_the_start(
    runner: Runner, data: str, workers: int
) -> None:
    scenario = replace(CASES[data], num_workers=workers)
    root = runner.root / f"skips-{data}-workers{workers}"
    reference = run_chain(root / "reference", scenario, [Leg("end", config=skipping(scenario, root / "audit-ref"))])
    # The spiking run saves at step 2 (after batch 1) and goes on; it is rolled back to that checkpoint.
    spiking = [Leg("batch_end", epoch=0, batch=1, config=(("audit_dir", str(root / "audit-rec")),))]
    recovered = [
        *spiking,
        Leg("kill", epoch=1, batch=1, config=skipping(scenario, root / "audit-rec")),  # the recovered run killed
        Leg("end", config=skipping(scenario, root / "audit-rec")),
    ]
    steps, validations = run_chain(root / "recovered", scenario, recovered)
    for rank in reference[0]:
        assert steps[rank] == reference[0][rank], f"rank {rank}: the recovered run trained other steps"
        assert validations[rank] == reference[1][rank], f"rank {rank}: other validations"
    # What was skipped is the spiking run's steps 3-6 and 9-10: the others train its ids and augmentations (a
    # mixture's run goes on in its stream: the spiking run is run two epochs longer to hold them).
    spiking_run = run_chain(root / "spiking", replace(scenario, epochs=scenario.epochs + 2), [Leg("end")])[0]
    for rank in spiking_run:
        kept = [s for s in range(len(spiking_run[rank])) if not any(a <= s <= b for a, b in SKIPPED)]
        want = [{k: spiking_run[rank][step][k] for k in ("ids", "aug")} for step in kept][: len(steps[rank])]
        assert [{k: step[k] for k in ("ids", "aug")} for step in steps[rank]] == want, f"rank {rank}"
    epoch = scenario.batches_per_epoch  # a mixture's epochs keep their length; the others' are shortened
    expected_steps = 3 * epoch - (0 if data == "mixture" else sum(b - a + 1 for a, b in SKIPPED))
    assert [len(each) for each in steps.values()] == [expected_steps] * 2
    assert first_divergence(read_audit(root / "audit-ref"), read_audit(root / "audit-rec")) is None
    inspected = subprocess.run(
        [sys.executable, "-m", "lightning_resumable", "inspect", str(root / "recovered" / "leg1.ckpt")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert "skipped steps 3-6: their data" in inspected.stdout and "passed over at step 5" in inspected.stdout
    marks = [json.loads(line) for line in (root / "audit-rec" / "audit.rank0.jsonl").read_text().splitlines()]
    assert [mark["skipped"]["steps"] for mark in marks if "skipped" in mark] == ["3-6", "9-10"]
    # ``batches`` lists, from the recovered run's last checkpoint alone, what every step read or will read.
    audit = read_audit(root / "audit-ref")
    mixture = None
    if data == "mixture":
        schedule = WeightSchedule({step: dict(weights) for step, weights in scenario.mixture_weights})
        sources = {name: OffsetDataset(size, MIXTURE_OFFSETS[name]) for name, size in scenario.mixture_sources}
        mixture = Mixture(sources, schedule, samples_per_epoch=scenario.dataset_size)
    if data in ("stream", "hf"):  # a stream's order is its readers' state: batches says so, and points to the log
        with pytest.raises(OrderUnknownError, match="audit log"):
            step_batches(root / "recovered" / "leg1.ckpt", "0-3")
        return
    listed = step_batches(root / "recovered" / "leg1.ckpt", f"0-{expected_steps - 1}", mixture=mixture)
    assert {entry.trained for entry in listed} == {True, False}, "the checkpoint is not inside the run"
    for rank, records in audit.items():
        assert [entry.samples for entry in listed if entry.rank == rank] == [record["ids"] for record in records]
    command = [sys.executable, "-m", "lightning_resumable", "batches", str(root / "recovered" / "leg1.ckpt")]
    shown = subprocess.run([*command, "--steps", "0-2,7", "--json"], capture_output=True, text=True, check=False)
    if data == "map":
        assert shown.returncode == 0, shown.stderr
        wanted = [entry.to_dict() for entry in listed if entry.step in (0, 1, 2, 7)]
        assert [json.loads(line) for line in shown.stdout.splitlines()] == wanted
    else:  # the schedule is the run's configuration: the command says so, and where to look instead
        assert shown.returncode == 1 and "OrderUnknownError" in shown.stderr and "audit" in shown.stderr


@pytest.mark.parametrize("data", ["map", "stream"])
def test_a_save_at_the_end_of_an_epoch_a_skip_cut_resumes_the_skip_in_the_next(runner: Runner, data: str) -> None:
    """The skip 3-6 passes over epoch 0's last batches and epoch 1's first: a save after epoch 0's last trained batch
    (its batch 2) resumes with epoch 1's share still to pass over (a stream: read and discarded as epoch 1 begins)."""
    scenario = replace(CASES[data], num_workers=2)
    root = runner.root / f"skips-epoch-end-{data}"
    reference = run_chain(root / "reference", scenario, [Leg("end", config=skipping(scenario, root / "audit-ref"))])
    legs = [
        Leg("batch_end", epoch=0, batch=1),
        Leg("batch_end", epoch=0, batch=2, config=skipping(scenario, root / "audit-rec")),
        Leg("end", config=skipping(scenario, root / "audit-rec")),
    ]
    steps, validations = run_chain(root / "recovered", scenario, legs)
    assert steps == reference[0] and validations == reference[1]


def test_a_range_before_the_checkpoints_step_is_refused_before_any_step(runner: Runner) -> None:
    scenario = Scenario(world_size=2, num_workers=0, epochs=3)
    root = runner.root / "skips-refused"
    legs = [Leg("batch_end", epoch=0, batch=2), Leg("end", config=(("callback_options", [("skip_steps", "1-4")]),))]
    with pytest.raises(AssertionError, match="exited") as raised:
        run_chain(root, scenario, legs)
    assert "SkipError: the skipped steps 1-4 start before step 3, where the run resumes" in str(raised.value)
    assert read_records(root, "leg1", 2) == {0: [], 1: []}, "a step trained before the refusal"
    # The checkpoint is still resumable: without the bad range, the run from it is the uninterrupted one.
    rest = run_chain(root / "again", scenario, [Leg("end")], resume_from=root / "leg0.ckpt")[0]
    full = run_chain(root / "full", scenario, [Leg("end")])[0]
    assert {rank: steps[:3] + rest[rank] for rank, steps in full.items()} == full


def test_the_loss_spike_example_recovers_exactly(tmp_path: Path) -> None:
    """``examples/loss_spike.py``: a tiny GPT on a token mixture with a corrupt region, the spike found, its steps
    listed by ``batches``, rolled back and skipped, the recovered run killed by SIGKILL to its process group and
    resumed: it equals the reference given the skip from the start (ids and loss bits), 2 processes, 2 workers,
    each other run ending as a user's process does."""
    example = Path(__file__).resolve().parents[2] / "examples" / "loss_spike.py"
    log = tmp_path / "example.log"
    code = processes.run_tree(
        [sys.executable, str(example)], log, tmp_path, 3 * RUN_TIMEOUT_S, "the loss spike example"
    )
    output = log.read_text()
    assert code == 0 and "EXACT: the recovered run equals" in output, output[-4000:]
    assert " read the 40 corrupt blocks of the window" in output  # every corrupt block (CORRUPT holds 40), by batches
    assert "the recovered run was killed (SIGKILL to its process group) after a checkpoint at step 50" in output
    for rank in range(2):
        assert (
            f"rank {rank}: 60 steps; the rolled-back run equals the reference in ids at 60, loss bits at 60" in output
        )


RESIZED = {
    "map-2-to-1": (Scenario(world_size=2, epochs=3), 1, (1, 0), (7, 8)),
    "map-1-to-2": (Scenario(world_size=1, epochs=2), 2, (0, 3), (5, 6)),
    "mixture-2-to-1": (Scenario(world_size=2, epochs=3, data="mixture"), 1, (1, 0), (7, 8)),
    "bucketing-1-to-2": (Scenario(world_size=1, epochs=3, sampler="bucketing"), 2, (0, 3), (5, 6)),
}
"""A skip given at a resume on another world size (issue 53): the setup, the resumed world size, the (epoch, batch)
the first run saves after, and the range, named in the first run's steps. 2 -> 1: steps 7-8 are epoch 1's batches 2
and 3 on two processes (positions 16-31), which one process reaches at its step 8; 1 -> 2: steps 5-6 are positions
20-27 of epoch 0 on one process, which two processes reach inside their step 4 (its batch reads around them)."""


@pytest.mark.parametrize("case", sorted(RESIZED))
def test_a_skip_given_at_a_resume_on_another_world_size_skips_the_steps_the_checkpoints_run_numbered(
    runner: Runner, case: str
) -> None:
    """Steps are placed on the world size that wrote the checkpoint (docs/long-runs.md): the run that resumes on
    another world size with the skip trains what the run given it from the start (on the first world size, then
    resumed on the same other world size) trains, and none of the skipped steps' samples, which ``batches`` lists
    from the checkpoint alone."""
    scenario, resized, (epoch, batch), (first, last) = RESIZED[case]
    root = runner.root / f"skips-resized-{case}"
    skip = (("callback_options", [("skip_steps", f"{first}-{last}")]),)

    def logged(name: str, *config: tuple[str, object]) -> tuple[tuple[str, object], ...]:
        return (*config, ("audit_dir", str(root / f"audit-{name}")))

    stop = Leg("batch_end", epoch=epoch, batch=batch)
    reference_legs = [replace(stop, config=logged("ref", *skip)), Leg("end", world_size=resized, config=logged("ref"))]
    reference = run_chain(root / "reference", scenario, reference_legs)
    legs = [replace(stop, config=logged("rec")), Leg("end", world_size=resized, config=logged("rec", *skip))]
    steps, validations = run_chain(root / "recovered", scenario, legs)
    assert steps == reference[0], "the resumed run trained other data than the run given the skip from the start"
    assert validations == reference[1]
    # Both mark the resumed run's first step after the skip alike: a recorded skip is reached at the steps of the
    # world size that resumes it, as one given there is.
    audits = read_audit(root / "audit-rec"), read_audit(root / "audit-ref")
    assert first_divergence(*audits) is None
    marks = [[index for index, record in enumerate(audit[0]) if "skipped" in record] for audit in audits]
    assert marks[0] == marks[1] and len(marks[0]) == 1, f"the skip marked at rank 0's steps {marks}"
    assert marks[0][0] > epoch * scenario.batches_per_epoch + batch
    if scenario.data != "map" or scenario.sampler != "shuffle":  # batches cannot tell their order from the state
        return
    saved_at = epoch * scenario.batches_per_epoch + batch + 1
    skipped = step_batches(root / "recovered" / "leg0.ckpt", f"{first}-{last}")
    assert {entry.step for entry in skipped} == set(range(first, last + 1)) and not any(e.trained for e in skipped)
    skipped_ids = {sample for entry in skipped for sample in entry.samples}
    resumed = [record for rank in steps for record in steps[rank][saved_at:] if record["epoch"] == epoch]
    trained_after = {sample for record in resumed for sample in record["ids"]}
    assert skipped_ids and not skipped_ids & trained_after, "a skipped step's samples were trained"
