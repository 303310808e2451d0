"""End to end: streams (a user's stateful stream, a Hugging Face stream) and several train loaders
(a CombinedLoader in each mode) stopped mid-epoch and resumed under DDP are exact, step for step.

Controls run plain Lightning on the same setups: its look-ahead makes a resumed stream skip the batch
after the checkpoint on every rank, and its max_size_cycle repeats a short loader's order in every
cycle of an epoch. Refusals: a stream resumed on another world size or worker count, several loaders
on another world size.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from . import layout_chains, processes
from .chains import Leg, run_chain
from .data_setups import COMBINED_SIZES, STREAM_SIZE
from .harness import FIELDS, RUN_TIMEOUT_S, Outcome, Records, Runner, Scenario, read_records
from .layout_chains import HF_LAYOUT_CHAIN_SEEDS, draw_litdata_chain, litdata_chain_problems, stream_plans
from .matrix import case_problems, described, draw_case, elsewhere_mismatches, ordered_mismatches, seeds

STREAMS = [
    Scenario(world_size=2, num_workers=0, loader="DataLoader", data="stream", stop_kind="batch_end"),
    Scenario(world_size=2, num_workers=0, loader="StatefulDataLoader", data="stream", stop_kind="in_step"),
    Scenario(world_size=2, num_workers=2, loader="DataLoader", data="stream", stop_kind="validation"),
    Scenario(world_size=2, num_workers=2, loader="StatefulDataLoader", data="stream", stop_kind="batch_end"),
    Scenario(world_size=2, num_workers=2, loader="StatefulDataLoader", data="stream", stop_kind="last_batch"),
    Scenario(world_size=2, num_workers=2, loader="DataLoader", data="hf", stop_kind="batch_end"),
    Scenario(world_size=2, num_workers=0, loader="StatefulDataLoader", data="hf", stop_kind="in_step"),
    # Shuffled through a buffer of 8 (issue 46): 4 readers of 12 samples each, so windows end mid-reader.
    *(
        Scenario(world_size=2, num_workers=workers, loader=loader, data="hf", shuffle_buffer=8, stop_kind=stop)
        for workers, loader, stop in (
            (2, "DataLoader", "batch_end"),
            (0, "StatefulDataLoader", "in_step"),
            (2, "StatefulDataLoader", "last_batch"),
        )
    ),
    # Read as Arrow tables (issue 55's throughput): a torch-formatted stream with no map, augmented in its collate;
    # stopped in a worker's second window of 8 (batches of 4), which a restore enters from its readers' positions.
    Scenario(world_size=2, num_workers=2, data="hf-arrow", shuffle_buffer=8, stop_batch_override=4),
    Scenario(
        world_size=2, num_workers=0, data="hf-arrow", shuffle_buffer=8, stop_kind="in_step", stop_batch_override=3
    ),
    # Two streams interleaved (`interleave_datasets`, each shuffled through a buffer of 8), augmented after it.
    Scenario(world_size=2, num_workers=2, data="hf-interleaved", shuffle_buffer=8, stop_batch_override=3),
    # 3 batches an epoch (batch 8): no validation after the last (val_check_interval=2), where a resume numbered
    # the next epoch's batches from 3 (Lightning cannot count an unsized loader's epoch to its end).
    Scenario(world_size=2, num_workers=0, loader="DataLoader", data="stream", stop_kind="last_batch", batch_size=8),
]
COMBINED = [
    Scenario(world_size=2, num_workers=2, data="combined", mode="max_size_cycle"),  # b in its 2nd cycle
    Scenario(world_size=2, num_workers=0, data="combined", mode="max_size_cycle", stop_batch_override=1),
    Scenario(world_size=2, num_workers=2, data="combined", mode="max_size"),  # b exhausted
    Scenario(world_size=2, num_workers=0, data="combined", mode="min_size"),
    Scenario(world_size=2, num_workers=2, data="dict", stop_kind="in_step"),  # Lightning's max_size_cycle
]


def ids_of(records: Records, epoch: int, key: str | None = None) -> list[int]:
    return [
        sample
        for rank_records in records.values()
        for record in rank_records
        if record["epoch"] == epoch
        for sample in ((record["ids"] if key is None else record["ids"][key]) or [])
    ]


@pytest.mark.parametrize("scenario", STREAMS, ids=[s.label() for s in STREAMS])
def test_a_stream_resumes_exactly(runner: Runner, scenario: Scenario) -> None:
    outcome = runner.run(scenario)
    if scenario.stop_kind == "last_batch":  # the next epoch's batches numbered from 0, as the uninterrupted run's
        assert (outcome.resumed[0][0]["epoch"], outcome.resumed[0][0]["batch"]) == (scenario.stop_epoch + 1, 0)
    assert outcome.stream_mismatches(FIELDS) == []
    for epoch in range(scenario.epochs):  # each epoch reads the whole stream once, across the ranks
        assert sorted(ids_of(outcome.full, epoch)) == list(range(STREAM_SIZE))
    if scenario.data == "stream" or scenario.shuffle_buffer:  # reshuffled each pass
        assert ids_of(outcome.full, 0) != ids_of(outcome.full, 1)


PERSISTENT = [
    # Saved before the second worker yielded in the epoch (its samples resumed under other seeds, and were refused).
    Scenario(world_size=2, num_workers=2, data="stream", persistent_workers=True, stop_batch_override=0),
    Scenario(world_size=2, num_workers=2, data="hf", shuffle_buffer=8, persistent_workers=True),
    Scenario(world_size=2, num_workers=2, data="hf-arrow", shuffle_buffer=8, persistent_workers=True),
]


@pytest.mark.parametrize("scenario", PERSISTENT, ids=[s.label() for s in PERSISTENT])
def test_a_stream_with_persistent_workers_resumes_exactly_and_reads_what_workers_started_anew_read(
    runner: Runner, scenario: Scenario
) -> None:
    """``persistent_workers=True`` (Lightning's advice for loaders with workers): the workers keep their copies of
    the stream across epochs and the resume; every epoch reads the trainer's, as workers started each pass do."""
    outcome = runner.run(scenario)
    assert outcome.stream_mismatches(FIELDS) == []
    anew = runner.full(replace(scenario, persistent_workers=False))
    assert [[(r["epoch"], r["ids"], r["aug"]) for r in records] for records in outcome.full.values()] == [
        [(r["epoch"], r["ids"], r["aug"]) for r in records] for records in anew.values()
    ]


@pytest.mark.parametrize("scenario", COMBINED, ids=[s.label() for s in COMBINED])
def test_several_loaders_resume_exactly_in_each_mode(runner: Runner, scenario: Scenario) -> None:
    outcome = runner.run(scenario)
    assert outcome.stream_mismatches() == []
    assert all(len(records) == scenario.epochs * scenario.batches_per_epoch for records in outcome.full.values())
    short = ids_of(outcome.full, 1, "b")
    everything_short = [1000 + i for i in range(COMBINED_SIZES[1])]
    if scenario.mode == "max_size":
        assert sorted(short) == everything_short  # once, then None
    if scenario.mode == "max_size_cycle":
        # The short loader restarts within the epoch, each cycle a whole, fresh permutation.
        per_rank = -(-COMBINED_SIZES[1] // scenario.world_size)
        by_rank = [[i for r in records if r["epoch"] == 1 for i in r["ids"]["b"]] for records in outcome.full.values()]
        cycles = [[i for ids in by_rank for i in ids[c * per_rank : (c + 1) * per_rank]] for c in range(2)]
        assert sorted(cycles[0]) == sorted(cycles[1]) == everything_short
        assert cycles[0] != cycles[1]


def test_control_plain_lightning_skips_the_batch_after_the_checkpoint(runner: Runner) -> None:
    """Lightning's look-ahead: the saved loader state is one batch too far, on every rank. (The Hugging
    Face stream's state is the same on both ranks here, so rank 0's state does rank 1 no harm.)"""
    scenario = replace(STREAMS[5], resumable=False, loader="StatefulDataLoader")
    outcome = runner.run(scenario)
    stop = scenario.stop_batch
    for rank, full in outcome.full.items():
        resumed = outcome.resumed[rank]
        assert len(outcome.stopped[rank]) + len(resumed) == len(full) - 1, "one batch fewer"
        skipped = full[len(outcome.stopped[rank])]
        assert (skipped["epoch"], skipped["batch"]) == (scenario.stop_epoch, stop + 1)
        assert resumed[0]["ids"] == full[len(outcome.stopped[rank]) + 1]["ids"], "the batch after it comes first"


def test_control_plain_lightning_restores_rank_zeros_stream_state_on_every_rank(runner: Runner) -> None:
    """Only rank 0 writes the checkpoint: rank 1's stream gets rank 0's state and reads rank 0's shard on,
    silently, to the end of the epoch (rank ``r`` reads the ids ``r mod 2``)."""
    scenario = replace(STREAMS[3], resumable=False)
    resumed = runner.resumed(scenario)
    for rank in range(2):
        before = {sample_id % 2 for step in runner.stopped(scenario)[rank] for sample_id in step["ids"]}
        interrupted = [step for step in resumed[rank] if step["epoch"] == scenario.stop_epoch]
        after = {sample_id % 2 for step in interrupted for sample_id in step["ids"]}
        assert (before, after) == ({rank}, {0}), f"rank {rank}"


def test_control_plain_lightning_repeats_a_short_loaders_order_in_every_cycle(runner: Runner) -> None:
    plain = replace(COMBINED[1], resumable=False)
    outcome = runner.run(plain)
    assert outcome.stream_mismatches() != []
    short = [r["ids"]["b"] for r in outcome.full[0] if r["epoch"] == 1]
    per_rank_cycle = 2  # batches of b on each rank
    assert short[:per_rank_cycle] == short[per_rank_cycle : 2 * per_rank_cycle], "the same order again"


@pytest.mark.parametrize(
    ("scenario", "error"),
    [
        (replace(STREAMS[3], resume_world_size=1), "WorldSizeChangedError"),
        (replace(STREAMS[3], resume_num_workers=0), "WorkerCountChangedError"),
        (replace(COMBINED[0], resume_world_size=1), "WorldSizeChangedError"),
        (
            replace(STREAMS[3], resume_batch_size=6),
            "IncompatibleStateError: the checkpoint's stream was read in batches",
        ),
    ],
    ids=["stream-2to1", "stream-workers2to0", "combined-2to1", "stream-batch4to6"],
)
def test_a_resume_whose_saved_positions_mean_other_data_is_refused(
    runner: Runner, scenario: Scenario, error: str
) -> None:
    resumed = runner.resumed(scenario, expect_failure=True)
    assert not any(resumed.values()), "a resumed step trained"
    log = next(runner.root.joinpath(scenario.label()).glob("resume-*.log")).read_text()
    assert error in log


def test_the_hugging_face_streaming_example_is_exact_through_a_sigkill(tmp_path: Path) -> None:
    """``examples/hf_streaming.py`` (issue 46): parquet files, ``load_dataset(streaming=True)``, ``.shuffle(seed,
    buffer_size)``, an augmenting ``.map``, ``split_dataset_by_node``, 2 processes, 2 workers, the process group
    killed with SIGKILL after a checkpoint, each other run ending as a user's process does."""
    example = Path(__file__).resolve().parents[2] / "examples" / "hf_streaming.py"
    log = tmp_path / "example.log"
    code = processes.run_tree([sys.executable, str(example)], log, tmp_path, 3 * RUN_TIMEOUT_S, "the streaming example")
    output = log.read_text()
    assert code == 0 and "VERDICT: EXACT" in output, output[-4000:]
    for rank in range(2):
        assert f"     {rank}              42             42     42/42     42/42     42/42  exact" in output, output


def test_a_streams_save_from_an_errors_exception_path_on_two_processes_is_refused_at_the_resume(runner: Runner) -> None:
    """docs/guarantees.md: a save from the exception path of an error (here Ctrl-C on every rank, which Lightning
    hands to ``on_exception``) cannot gather the ranks' stream states: its checkpoint is written marked, and its
    resume is refused with ``MissingStateError`` naming why, before any step."""
    scenario = Scenario(world_size=2, num_workers=2, data="stream", epochs=2)
    root = runner.root / "stream-exception-path"
    with pytest.raises(AssertionError, match="exited") as raised:
        run_chain(root, scenario, [Leg("interrupt", epoch=0, batch=2), Leg("end")])
    assert "MissingStateError: the checkpoint holds no resumable data state" in str(raised.value)
    assert read_records(root, "leg1", 2) == {0: [], 1: []}, "a step trained before the refusal"


def test_a_stream_not_seeded_per_sample_whose_samples_draw_is_refused_at_the_resume_saying_why(
    runner: Runner,
) -> None:
    """``seed_samples=False`` over a stream whose samples draw from the global generators (the test's augmentation
    draws from torch's, Python's and NumPy's): its worker's generators after the resume are not the uninterrupted
    run's, so the first batch differs, and a stream's batch cannot be fetched again under a seed to tell why. The
    resume is refused before any step, the message naming the setting and what repeats (``sample_rng()``)."""
    scenario = Scenario(world_size=2, num_workers=1, data="stream", callback_options=(("seed_samples", False),))
    assert runner.resumed(scenario, expect_failure=True) == {0: [], 1: []}, "a step trained before the refusal"
    log = (runner.root / scenario.label() / "resume-on-2-attempt1.log").read_text()
    assert "ResumeVerificationError" in log and "The callback has seed_samples=False" in log, log[-3000:]
    assert "sample_rng()" in log, log[-3000:]


HF_ELSEWHERE = [
    Scenario(world_size=2, num_workers=2, data="hf", shuffle_buffer=8, resume_world_size=1, resume_num_workers=0),
    Scenario(
        world_size=2, num_workers=2, data="hf", shuffle_buffer=8, stop_kind="validation", resume_num_workers=1,
        resume_batch_size=6,
    ),
    Scenario(
        world_size=2, data="hf-arrow", shuffle_buffer=8, resume_world_size=1, resume_num_workers=2, resume_batch_size=4,
    ),
    Scenario(
        world_size=1, num_workers=2, data="hf", shuffle_buffer=8, resume_world_size=2, resume_batch_size=2,
        persistent_workers=True,
    ),
    Scenario(world_size=2, data="hf", stop_kind="last_batch", resume_world_size=1),
    Scenario(world_size=2, data="hf", shuffle_buffer=8, resume_world_size=4),
    Scenario(
        world_size=2, num_workers=1, data="hf-interleaved", shuffle_buffer=8, resume_world_size=1, resume_num_workers=2,
        resume_batch_size=6,
    ),
]  # fmt: skip
"""Issue 55: a Hugging Face stream requeued on another allocation: 2 processes with 2 workers -> 1 without (shuffled
through a buffer of 8); -> 1 worker and batches of 6 (a stop at a validation); read as Arrow tables and augmented in
the collate, 2 processes without workers -> 1 with 2, the same batches of 4 (the collate draws as the first layout's
did: each item read under its own seed leaves the generators as its reading did); 1 process with 2 workers -> 2 with
batches of 2 and workers kept; an epoch's last batch, 2 -> 1 (not shuffled); 2 processes -> 4 (batches of 2); two
streams interleaved, 2 processes with 1 worker -> 1 with 2 and batches of 6."""


@pytest.mark.parametrize("scenario", HF_ELSEWHERE, ids=[s.label() for s in HF_ELSEWHERE])
def test_a_hugging_face_stream_resumed_on_another_layout_goes_on_in_the_interrupted_epochs_order(
    runner: Runner, scenario: Scenario
) -> None:
    """The interrupted epoch's samples go on in the global order the first layout would have trained them (each
    resumed worker reads the first layout's workers' shares of the stream, split as ``datasets`` split them, from
    their saved states), each with what ``map`` drew for it; the next epochs are what a fresh run of the new layout
    reads."""
    assert elsewhere_mismatches(runner, runner.run(scenario)) == []


HF_ORDERED = [each.declaring_its_order() for each in (HF_ELSEWHERE[1], HF_ELSEWHERE[3], HF_ELSEWHERE[6])]
"""Issue 55, one order whatever the layout: the stream declares the first launch's layout as its order, and the
resumes of `HF_ELSEWHERE` (2 x 2 -> 2 x 1 with batches of 6, at a validation; 1 x 2 -> 2 x 2 with batches of 2 and
workers kept; two streams interleaved, 2 x 1 -> 1 x 2 with batches of 6) read the interrupted epoch and every later
one in it."""


@pytest.mark.parametrize("scenario", HF_ORDERED, ids=[s.label() for s in HF_ORDERED])
def test_a_hugging_face_stream_declaring_its_order_reads_every_epoch_in_it_on_another_layout(
    runner: Runner, scenario: Scenario
) -> None:
    assert ordered_mismatches(runner.run(scenario)) == []


@pytest.mark.parametrize("seed", seeds(fixed=HF_LAYOUT_CHAIN_SEEDS))
def test_a_drawn_chain_of_hugging_face_layouts_resumes_exactly(runner: Runner, seed: int) -> None:
    """Issue 55: a Hugging Face stream (shuffled through a buffer of 8) interrupted one to three times, each resume on
    a layout drawn anew (world size, batch size, 0 to 3 workers, kept workers; drawn as LitData's chains are),
    every epoch judged against a fresh run of the layout that began it. ``E2E_MATRIX_SEEDS`` draws others."""
    chain = draw_litdata_chain(seed, stream_plans(runner, "hf"), data="hf")
    where = f"seed {seed} ({layout_chains.described(chain.layouts)}; {described(chain.legs)})"
    problems = litdata_chain_problems(runner, chain, runner.root / f"hf-layout-chain{seed}")
    rerun = (
        f"E2E_MATRIX_SEEDS={seed} python -m pytest -m e2e tests/e2e/test_streams_and_loaders.py -k hugging_face_layouts"
    )
    assert problems == [], f"{where} is not exact; rerun: {rerun}\n" + "\n".join(problems[:6])


HF_MOVED_SEEDS = (2000227, 150)
"""Matrix cases of a Hugging Face stream requeued on another allocation (issue 55): 1 process -> 2, stopped at a
validation in the first epoch; batches of 4 -> 8 at an epoch's last batch, the stream declaring the first launch's
layout as its order (the soaks draw the others; CI's time is bounded)."""


@pytest.mark.parametrize("seed", HF_MOVED_SEEDS)
def test_a_drawn_hugging_face_case_on_another_layout_goes_on_in_the_interrupted_epochs_order(
    runner: Runner, seed: int
) -> None:
    scenario, reference = draw_case(seed)
    moved = (scenario.resume_world_size, scenario.resume_num_workers, scenario.resume_batch_size)
    assert scenario.data == "hf" and moved != (None, None, None)
    problems = case_problems(runner, scenario, reference)
    assert problems == [], f"seed {seed} ({scenario.label()})\n" + "\n".join(problems[:6])


@pytest.mark.parametrize("data", ["hf", "wds"])
def test_a_stream_on_other_workers_trains_the_interrupted_epoch_as_the_uninterrupted_run_loss_bits_too(
    runner: Runner, data: str
) -> None:
    """Issue 55 on the same world size and batch size with other workers (2 -> 1): the interrupted epoch's steps are
    the uninterrupted run's, ids, augmentations and loss bits; the next epochs are the new layout's own."""
    if data == "wds":
        pytest.importorskip("webdataset")
    scenario = Scenario(world_size=2, num_workers=2, data=data, shuffle_buffer=5, resume_num_workers=1)
    outcome = runner.run(scenario)

    def interrupted(records: Records) -> Records:
        return {rank: [r for r in steps if r["epoch"] <= scenario.stop_epoch] for rank, steps in records.items()}

    epoch = Outcome(scenario, interrupted(outcome.full), interrupted(outcome.stopped), interrupted(outcome.resumed))
    assert epoch.stream_mismatches(FIELDS) == []
    assert elsewhere_mismatches(runner, outcome) == []
