"""The randomized workflow matrix: from one integer seed, a whole case (the train input, the run, where it
is interrupted, what changes at the resume) is drawn and run against its uninterrupted twin, per rank
and step: sample ids, augmentations, loss bits and every validation (step, batches, metric bits).

CI runs `CI_SEEDS` (every seed a soak found failing joins them). To run other seeds or a soak:

    E2E_MATRIX_SEEDS=17,123 python -m pytest -m e2e tests/e2e/test_workflow_matrix.py
    E2E_MATRIX_SOAK=300 python -m pytest -m e2e tests/e2e/test_workflow_matrix.py   # fresh seeds, printed

A failure names its seed, the command that reruns it, and the one that shrinks it to its smallest failing
form (``python -m tests.e2e.shrink SEED [--chain]``, `shrink.py`). The draw keeps to what the docs promise exact
(docs/guarantees.md); a refusal is never an accepted outcome here.
"""

from __future__ import annotations

import importlib.util
import itertools
from collections.abc import Callable
from dataclasses import replace

import pytest

from . import layout_chains
from .chains import CASE_SEEDS, CHAIN_SEEDS, CHAINS_OF_CI_SEEDS, LIBRARY_SEEDS, Leg
from .harness import Runner, Scenario
from .layout_chains import (
    LITDATA_CHAIN_SEEDS,
    MOSAIC_CHAIN_SEEDS,
    draw_litdata_chain,
    draw_mosaic_chain,
    litdata_chain_problems,
    litdata_plans,
    mosaic_chain_problems,
)
from .matrix import (
    case_problems,
    chain_problems,
    described,
    draw_case,
    draw_chain,
    draw_library_case,
    library_data_written,
    library_reference,
    seeds,
)
from .shrink import Case, shrink
from .train import LITDATA_DIR


def skip_without_web_dataset(scenario: Scenario) -> None:
    """A WebDataset case where webdataset is not installed (CI's main step; its extras step runs them)."""
    if scenario.data == "wds" and importlib.util.find_spec("webdataset") is None:
        pytest.skip("webdataset is not installed")


@pytest.mark.parametrize("seed", seeds(CASE_SEEDS))
def test_a_drawn_workflow_resumes_exactly(runner: Runner, seed: int) -> None:
    scenario, reference = draw_case(seed)
    skip_without_web_dataset(scenario)
    rerun = f"E2E_MATRIX_SEEDS={seed} python -m pytest -m e2e tests/e2e/test_workflow_matrix.py"
    shrink = f"python -m tests.e2e.shrink {seed}"
    where = f"seed {seed} ({scenario.label()})"
    try:
        problems = case_problems(runner, scenario, reference)
    except AssertionError as error:  # a run that failed or refused
        raise AssertionError(f"{where}: a run failed; rerun: {rerun}; shrink: {shrink}\n{error}") from None
    assert problems == [], f"{where} is not exact; rerun: {rerun}; shrink: {shrink}\n" + "\n".join(problems[:6])


def test_the_draw_is_a_pure_function_of_the_seed() -> None:
    assert [draw_case(seed) for seed in range(50)] == [draw_case(seed) for seed in range(50)]
    drawn = {draw_case(seed)[0].data for seed in range(200)}
    kinds = {"map", "stream", "hf", "hf-interleaved", "wds", "mixture", "combined", "dict"}
    assert drawn == kinds, "every kind of train input is drawn"


@pytest.mark.parametrize("seed", seeds(CHAIN_SEEDS, fixed=CHAINS_OF_CI_SEEDS))
def test_a_drawn_run_interrupted_several_times_resumes_exactly(runner: Runner, seed: int) -> None:
    scenario, legs = draw_chain(seed)
    skip_without_web_dataset(scenario)
    rerun = f"E2E_MATRIX_SEEDS={seed} python -m pytest -m e2e tests/e2e/test_workflow_matrix.py"
    shrink = f"python -m tests.e2e.shrink {seed} --chain"
    where = f"seed {seed} ({scenario.label()}: {described(legs)})"
    try:
        problems = chain_problems(runner, scenario, legs, runner.root / f"chain{seed}-{scenario.label()}")
    except AssertionError as error:
        raise AssertionError(f"{where}: a leg failed; rerun: {rerun}; shrink: {shrink}\n{error}") from None
    assert problems == [], f"{where} is not exact; rerun: {rerun}; shrink: {shrink}\n" + "\n".join(problems[:6])


@pytest.mark.parametrize("seed", seeds(fixed=LIBRARY_SEEDS))
def test_a_drawn_data_library_workflow_resumes_exactly(runner: Runner, seed: int) -> None:
    """LitData and MosaicML Streaming where installed (CI's extras step): their streams, drawn by
    `draw_library_case`, each compared with its uninterrupted twin."""
    scenario = draw_library_case(seed)
    needed = {"mosaic": ["streaming"], "sharded-mixture": ["litdata", "streaming"]}.get(scenario.data, ["litdata"])
    missing = [library for library in needed if importlib.util.find_spec(library) is None]
    if missing:  # (Mosaic is imported with a stand-in for torchvision)
        pytest.skip(f"{missing} not installed")
    library_data_written(runner, scenario.data)
    rerun = f"E2E_MATRIX_SEEDS={seed} python -m pytest -m e2e tests/e2e/test_workflow_matrix.py -k library"
    _assert_exact(
        f"seed {seed} ({scenario.label()})", rerun, lambda: case_problems(runner, scenario, library_reference(scenario))
    )


def _assert_exact(where: str, rerun: str, problems_of: Callable[[], list[str]]) -> None:
    """Judge a drawn run: a run that failed, and one that is not exact, each named with the command that reruns it."""
    try:
        problems = problems_of()
    except AssertionError as error:  # a run that failed or refused
        raise AssertionError(f"{where}: a run failed; rerun: {rerun}\n{error}") from None
    assert problems == [], f"{where} is not exact; rerun: {rerun}\n" + "\n".join(problems[:6])


@pytest.mark.parametrize("seed", seeds(fixed=MOSAIC_CHAIN_SEEDS))
def test_a_drawn_data_library_chain_of_mosaic_over_layouts_resumes_exactly(runner: Runner, seed: int) -> None:
    """Issue 55: MosaicML Streaming's loader interrupted one to three times, each resume on a layout drawn anew (world
    size, batch size, workers, kept workers; `layout_chains.draw_mosaic_chain`), every epoch judged against the
    uninterrupted run of the first layout."""
    if importlib.util.find_spec("streaming") is None:
        pytest.skip("MosaicML Streaming is not installed")
    scenario, legs, layouts = draw_mosaic_chain(seed)
    library_data_written(runner, "mosaic")
    rerun = f"E2E_MATRIX_SEEDS={seed} python -m pytest -m e2e tests/e2e/test_workflow_matrix.py -k chain_of_mosaic"
    where = f"seed {seed} ({layout_chains.described(layouts)}; {described(legs)})"
    _assert_exact(
        where, rerun, lambda: mosaic_chain_problems(runner, scenario, legs, runner.root / f"layout-chain{seed}")
    )


@pytest.mark.parametrize("seed", seeds(fixed=LITDATA_CHAIN_SEEDS))
def test_a_drawn_data_library_chain_of_litdata_over_layouts_resumes_exactly(runner: Runner, seed: int) -> None:
    """Issue 55: LitData's loader interrupted one to three times, each resume on a layout drawn anew (world size,
    batch size, 0 to 3 workers, kept workers; `layout_chains.draw_litdata_chain`), every epoch judged against a fresh
    run of the layout that began it."""
    if importlib.util.find_spec("litdata") is None:
        pytest.skip("LitData is not installed")
    library_data_written(runner, "litdata")
    chain = draw_litdata_chain(seed, litdata_plans(runner.root / LITDATA_DIR))
    rerun = f"E2E_MATRIX_SEEDS={seed} python -m pytest -m e2e tests/e2e/test_workflow_matrix.py -k chain_of_litdata"
    where = f"seed {seed} ({layout_chains.described(chain.layouts)}; {described(chain.legs)})"
    run_dir = runner.root / f"litdata-layout-chain{seed}"
    _assert_exact(where, rerun, lambda: litdata_chain_problems(runner, chain, run_dir))


def test_the_layout_chains_draw_new_layouts_at_their_resumes() -> None:
    drawn = [draw_mosaic_chain(seed) for seed in range(100)]
    assert drawn == [draw_mosaic_chain(seed) for seed in range(100)], "a pure function of the seed"
    changes = [
        (a.world_size != b.world_size, a.batch_size != b.batch_size)
        for _, _, ls in drawn
        for a, b in itertools.pairwise(ls)
    ]
    assert (True, False) in changes and (False, True) in changes and (True, True) in changes
    assert {len(legs) for _, legs, _ in drawn} >= {2, 3, 4}


def test_shrinking_keeps_only_what_the_failure_needs() -> None:
    """`shrink` on a stand-in judge that fails whenever workers read the data: every other option and the legs
    a failure does not need go, and the workers stay."""
    scenario, legs = draw_chain(next(seed for seed in range(1000) if _rich(draw_chain(seed))))
    judged: list[object] = []

    def fails(case: Case) -> list[str]:
        judged.append(case)
        return ["workers read the data"] if case[0].num_workers else []

    (smallest, _, kept), problems = shrink((scenario, scenario, tuple(legs)), fails, lambda line: None)
    assert problems == ["workers read the data"]
    assert smallest.num_workers == scenario.num_workers and smallest.world_size == 1
    assert (smallest.extra_saves_every, smallest.val_loader, smallest.manual_optimization) == (0, "plain", False)
    assert [leg.kind for leg in kept] == ["end"] and kept[0].num_workers in (None, 0)
    assert shrink((replace(scenario, num_workers=0), scenario, ()), fails, lambda line: None)[1] == []


def _rich(drawn: tuple[Scenario, list[Leg]]) -> bool:
    scenario, legs = drawn
    return scenario.num_workers > 0 and scenario.world_size == 2 and scenario.extra_saves_every > 0 and len(legs) > 2
