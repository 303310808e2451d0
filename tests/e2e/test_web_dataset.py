"""End to end: WebDataset pipelines shuffled through a buffer (issue 46), taken over by the library, stopped and
resumed under DDP (2 processes, gloo), exact step for step: ids, what ``map`` drew, loss bits, validations.

Single resumes at each kind of stop, with 0 and 2 workers; and runs interrupted several times in a row (a save
then the process killed, SIGTERM on every rank, an epoch's last batch), drawn by the workflow matrix
(`WEB_DATASET_CHAIN_SEEDS`). Needs webdataset: CI's extras step runs this module.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from . import layout_chains
from .data_setups import STREAM_SIZE
from .harness import FIELDS, Records, Runner, Scenario, check_run_exits
from .layout_chains import WEB_LAYOUT_CHAIN_SEEDS, draw_litdata_chain, litdata_chain_problems, stream_plans
from .matrix import (
    case_problems,
    chain_problems,
    described,
    draw_case,
    draw_chain,
    elsewhere_mismatches,
    ordered_mismatches,
    refused_problems,
    seeds,
)
from .train import WDS_REFUSED

pytest.importorskip("webdataset")

SCENARIOS = [
    Scenario(world_size=2, num_workers=workers, loader=loader, data="wds", shuffle_buffer=5, stop_kind=stop)
    for workers, loader, stop in (
        (2, "DataLoader", "batch_end"),
        (0, "StatefulDataLoader", "in_step"),
        (2, "StatefulDataLoader", "last_batch"),
        (0, "DataLoader", "validation"),
    )
]

BATCHED_IN_THE_PIPELINE = [
    Scenario(world_size=2, num_workers=workers, data="wds", shuffle_buffer=8, wds_form=form, stop_kind=stop)
    for form, workers, stop in (
        ("batched-after", 0, "batch_end"),
        ("batched-after", 2, "batch_end"),
        ("batched-before", 2, "validation"),
        ("web-loader", 0, "batch_end"),
        ("web-loader", 2, "last_batch"),
    )
]
"""Issue 53: pipelines that batch themselves (``.batched`` after or before the shuffle, a ``WebLoader`` with
``batch_size=None``): WebDataset 1.0.2's batched read a sample ahead, which the state counted as delivered, so the
resume ran one sample late (``ResumeVerificationError``; silently shifted with ``verify=False``)."""

WEB_DATASET_CHAIN_SEEDS = (1313, 964, 3123, 477, 21, 54, 80, 177, 265)
"""Matrix chains over a WebDataset pipeline on 2 processes: 1313, three kills (a save, then SIGKILL) across an
epoch's end, 0 workers; 964, SIGTERM twice in a row then across the epoch's end, 2 workers; 3123, a kill then a
SIGTERM in the last epoch, 2 workers; 477, an epoch's last batch then SIGTERM twice, 0 workers. Batched in the
pipeline (issue 53): 21, a WebLoader on 1 process, 3 workers, validate() then a kill; 54, batched after the shuffle
on 1 process, an epoch's last batch, a save, Ctrl-C; 80, batched before it, SIGTERM, a validation, a skip given from
the start; 177, the same on 1 process, SIGTERM then Ctrl-C twice; 265, a WebLoader, an epoch's last batch, a skip."""

WEB_DATASET_CASE_SEEDS = (54, 76, 80, 265)
"""Matrix cases (a stop and a resume against the uninterrupted run) of each form batched in the pipeline: batched
after the shuffle on 1 process and on 2 (76, a validation's stop), before it (80), a WebLoader (265)."""


def ids_of(records: Records, epoch: int) -> list[int]:
    return [
        sample for rank in records.values() for record in rank if record["epoch"] == epoch for sample in record["ids"]
    ]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.label() for s in SCENARIOS])
def test_a_shuffled_web_dataset_resumes_exactly(runner: Runner, scenario: Scenario) -> None:
    outcome = runner.run(scenario)
    fields = FIELDS
    if scenario.stop_kind == "last_batch":  # Lightning numbers the next epoch's batches on (test_streams_and_loaders)
        fields = tuple(name for name in FIELDS if name != "batch")
    assert outcome.stream_mismatches(fields) == []
    for epoch in range(scenario.epochs):
        assert sorted(ids_of(outcome.full, epoch)) == list(range(STREAM_SIZE))
    assert ids_of(outcome.full, 0) != ids_of(outcome.full, 1), "shards and samples reshuffled each epoch"


def test_a_web_dataset_with_persistent_workers_resumes_exactly_and_reads_what_workers_started_anew_read(
    runner: Runner,
) -> None:
    """``persistent_workers=True``: the workers keep their copies of the pipeline across epochs and the resume (the
    same check as for the other streams, `test_streams_and_loaders.py`). Saved after the second epoch's first batch,
    before the second worker yielded in it (a kept worker's state is taken as its pass is made: it was the last
    pass's place and count, and the resume refused)."""
    scenario = Scenario(
        world_size=2, num_workers=2, data="wds", shuffle_buffer=8, persistent_workers=True, stop_batch_override=0
    )
    outcome = runner.run(scenario)
    assert outcome.stream_mismatches(FIELDS) == []
    anew = runner.full(replace(scenario, persistent_workers=False))
    assert [[(r["epoch"], r["ids"], r["aug"]) for r in records] for records in outcome.full.values()] == [
        [(r["epoch"], r["ids"], r["aug"]) for r in records] for records in anew.values()
    ]


@pytest.mark.parametrize("scenario", BATCHED_IN_THE_PIPELINE, ids=[s.label() for s in BATCHED_IN_THE_PIPELINE])
def test_a_web_dataset_batched_in_its_pipeline_resumes_exactly(runner: Runner, scenario: Scenario) -> None:
    test_a_shuffled_web_dataset_resumes_exactly(runner, scenario)


@pytest.mark.parametrize("seed", WEB_DATASET_CASE_SEEDS)
def test_a_drawn_web_dataset_case_resumes_exactly(runner: Runner, seed: int) -> None:
    scenario, reference = draw_case(seed)
    assert scenario.data == "wds" and scenario.wds_form and not scenario.wds_refused
    problems = case_problems(runner, scenario, reference)
    assert problems == [], f"seed {seed} ({scenario.label()})\n" + "\n".join(problems[:6])


WEB_DATASET_MOVED_SEEDS = (878811239,)
"""A matrix case of a WebDataset pipeline requeued on another allocation (issue 55, a soak's): batched after the
shuffle, 2 processes with 1 worker -> 1 (the soaks draw the others; CI's time is bounded)."""


@pytest.mark.parametrize("seed", WEB_DATASET_MOVED_SEEDS)
def test_a_drawn_web_dataset_case_on_another_layout_goes_on_in_the_interrupted_epochs_order(
    runner: Runner, seed: int
) -> None:
    scenario, reference = draw_case(seed)
    moved = (scenario.resume_world_size, scenario.resume_num_workers, scenario.resume_batch_size)
    assert scenario.data == "wds" and moved != (None, None, None)
    problems = case_problems(runner, scenario, reference)
    assert problems == [], f"seed {seed} ({scenario.label()})\n" + "\n".join(problems[:6])


@pytest.mark.parametrize("seed", seeds(fixed=WEB_LAYOUT_CHAIN_SEEDS))
def test_a_drawn_chain_of_web_dataset_layouts_resumes_exactly(runner: Runner, seed: int) -> None:
    """Issue 55: a WebDataset pipeline interrupted one to three times, each resume on a layout drawn anew (world size,
    batch size, 0 to 3 workers, kept workers; drawn as LitData's chains are, `layout_chains.draw_litdata_chain`),
    every epoch judged against a fresh run of the layout that began it. ``E2E_MATRIX_SOAK``/``E2E_MATRIX_SEEDS`` draw
    others."""
    chain = draw_litdata_chain(seed, stream_plans(runner, "wds"), data="wds")
    where = f"seed {seed} ({layout_chains.described(chain.layouts)}; {described(chain.legs)})"
    problems = litdata_chain_problems(runner, chain, runner.root / f"web-layout-chain{seed}")
    rerun = f"E2E_MATRIX_SEEDS={seed} python -m pytest -m e2e tests/e2e/test_web_dataset.py -k web_dataset_layouts"
    assert problems == [], f"{where} is not exact; rerun: {rerun}\n" + "\n".join(problems[:6])


@pytest.mark.parametrize("refused", sorted(WDS_REFUSED))
def test_every_stage_the_docs_refuse_ends_the_run_before_any_step_naming_it(runner: Runner, refused: str) -> None:
    """docs/streams-and-loaders.md's refusals (issue 53: ``cache_dir`` trained, its cache left empty), each through
    Lightning's own launcher on 2 processes (the matrix draws them in its cases too)."""
    scenario = Scenario(world_size=2, data="wds", shuffle_buffer=5, wds_refused=refused)
    assert refused_problems(runner, scenario) == []
    if refused == "cache_dir":
        assert not any((runner.root / "wds-cache").iterdir()), "nothing is cached: the run refused before reading"


@pytest.mark.parametrize("seed", WEB_DATASET_CHAIN_SEEDS)
def test_a_web_dataset_interrupted_several_times_resumes_exactly(runner: Runner, seed: int) -> None:
    scenario, legs = draw_chain(seed)
    assert scenario.data == "wds"
    problems = chain_problems(runner, scenario, legs, runner.root / f"chain{seed}-{scenario.label()}")
    assert problems == [], f"seed {seed} ({scenario.label()}: {described(legs)})\n" + "\n".join(problems[:6])


@pytest.mark.parametrize("form", ["", "batched-after"])
def test_a_web_dataset_run_stopped_by_max_steps_exits_on_its_own(
    tmp_path_factory: pytest.TempPathFactory, form: str
) -> None:
    """As `test_exits.py` for the other loaders: ``python train.py`` over a WebDataset pipeline (batched by the loader
    or in the pipeline), stopped inside an epoch with its workers running, ends by a normal interpreter exit."""
    scenario = Scenario(world_size=2, num_workers=2, data="wds", shuffle_buffer=5, wds_form=form)
    check_run_exits(tmp_path_factory.mktemp("exits"), scenario)


ELSEWHERE = [
    Scenario(world_size=2, num_workers=2, data="wds", shuffle_buffer=5, resume_world_size=1, resume_num_workers=0),
    Scenario(world_size=2, num_workers=2, data="wds", shuffle_buffer=5, resume_num_workers=3, resume_batch_size=6),
    Scenario(
        world_size=1,
        num_workers=3,
        data="wds",
        shuffle_buffer=5,
        stop_kind="validation",
        resume_world_size=2,
        resume_batch_size=2,
        persistent_workers=True,
    ),
    Scenario(world_size=2, data="wds", shuffle_buffer=5, stop_kind="last_batch", resume_world_size=1),
    Scenario(world_size=2, num_workers=1, data="wds", shuffle_buffer=5, resume_world_size=4),
    Scenario(
        world_size=2,
        num_workers=2,
        data="wds",
        shuffle_buffer=8,
        wds_form="batched-after",
        resume_world_size=1,
        resume_batch_size=4,
    ),
]
"""Issue 55: a WebDataset pipeline requeued on another allocation: 2 processes with 2 workers -> 1 without, -> 2
with 3 workers and batches of 6; 1 process with 3 workers -> 2 with batches of 2 and workers kept (a stop at a
validation); an epoch's last batch, 2 -> 1; 2 processes with 1 worker -> 4 (batches of 2); batched in the
pipeline, 2 -> 1."""


@pytest.mark.parametrize("scenario", ELSEWHERE, ids=[s.label() for s in ELSEWHERE])
def test_a_web_dataset_resumed_on_another_layout_goes_on_in_the_interrupted_epochs_order(
    runner: Runner, scenario: Scenario
) -> None:
    """The interrupted epoch's samples go on in the global order the first layout would have trained them (the rest
    of its sequence, dealt in global batches of the new layout; a last uneven one padded with its own samples),
    each with what ``map`` drew for it; the next epochs are what a fresh run of the new layout reads."""
    assert elsewhere_mismatches(runner, runner.run(scenario)) == []


WEB_ORDERED = [
    ELSEWHERE[0].declaring_its_order(),
    ELSEWHERE[2].declaring_its_order(),
    ELSEWHERE[5].declaring_its_order(),
]
"""Issue 55, one order whatever the layout: the pipeline declares the first launch's layout as its order, and the
resumes of `ELSEWHERE` (2 x 2 -> 1 x 0; 1 x 3 -> 2 x 3 with batches of 2 and workers kept, at a validation; batched in
the pipeline, 2 -> 1) read the interrupted epoch and every later one in it (their stopped and uninterrupted runs are
those of `ELSEWHERE`: the declaration changes nothing on the declared layout)."""


@pytest.mark.parametrize("scenario", WEB_ORDERED, ids=[s.label() for s in WEB_ORDERED])
def test_a_web_dataset_declaring_its_order_reads_every_epoch_in_it_on_another_layout(
    runner: Runner, scenario: Scenario
) -> None:
    assert ordered_mismatches(runner.run(scenario)) == []
