"""Shrink a failing workflow-matrix seed to its smallest failing form.

    python -m tests.e2e.shrink SEED            # a case of test_a_drawn_workflow_resumes_exactly
    python -m tests.e2e.shrink SEED --chain    # a chain of test_a_drawn_run_interrupted_several_times_resumes_exactly

Greedy, as a property-based tester shrinks: each simplification (one process, no workers, no extra saves,
a plain validation loader, automatic optimization, fewer legs, ...) is kept when the case still fails,
until none is. Prints each step and the smallest failing form with its first problem; a case that passes
as drawn prints that and exits 1. Runs are real (the e2e harness), so this takes minutes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from .chains import Leg
from .harness import Runner, Scenario
from .matrix import case_problems, chain_problems, described, draw_case, draw_chain

Case = tuple[Scenario, Scenario, tuple[Leg, ...]]
"""The scenario, its reference (a case) and its legs (a chain; empty for a case)."""

_SIMPLER: dict[str, object] = dict(
    resume_num_workers=None,
    extra_saves_every=0,
    evaluate_before_resume=False,
    val_loader="plain",
    manual_optimization=False,
    limit_train_batches=None,
    estimated_stepping_batches=False,
    resume_mixture_sources=None,
    persistent_workers=False,
    epochs=2,
    num_workers=0,
    world_size=1,
)
"""Each field's simplest value, tried in this order (what changes the reference's stop step, last)."""


def simpler(case: Case) -> Iterator[tuple[str, Case]]:
    """Each one-step simplification of ``case``, described."""
    scenario, reference, legs = case
    for index in range(len(legs) - 1):  # a chain: drop one leg (never the last, which runs to the end)
        yield f"without leg {index} ({legs[index].kind})", (scenario, reference, legs[:index] + legs[index + 1 :])
    for index, leg in enumerate(legs):
        if leg.num_workers not in (None, 0):
            fewer = replace(leg, num_workers=0)
            yield f"leg {index} without workers", (scenario, reference, (*legs[:index], fewer, *legs[index + 1 :]))
    for name, value in _SIMPLER.items():
        if getattr(scenario, name) == value:
            continue
        if name == "world_size" and (scenario.resume_mixture_weights or scenario.resume_world_size):
            continue  # the reference's stop step, or the elastic check, depends on it
        if name == "epochs" and (scenario.stop_epoch >= 1 or any(leg.epoch >= 1 for leg in legs)):
            continue
        yield f"{name}={value!r}", (replace(scenario, **{name: value}), replace(reference, **{name: value}), legs)  # type: ignore[arg-type]


def problems_of(case: Case, root: Path, attempt: int) -> list[str]:
    scenario, reference, legs = case
    runner = Runner(root / f"attempt{attempt}")
    try:
        if legs:
            return chain_problems(runner, scenario, legs, runner.root / "chain")
        return case_problems(runner, scenario, reference)
    except AssertionError as error:
        return [f"a run failed: {str(error)[-600:]}"]


def shrink(case: Case, fails: Callable[[Case], list[str]], say: Callable[[str], None]) -> tuple[Case, list[str]]:
    """The smallest form of ``case`` that still fails (``fails`` returns its problems; empty: it passes)."""
    problems = fails(case)
    if not problems:
        return case, []
    progress = True
    while progress:
        progress = False
        for what, candidate in simpler(case):
            found = fails(candidate)
            say(f"  {what}: {'still fails' if found else 'passes'}")
            if found:
                case, problems, progress = candidate, found, True
                break
    return case, problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("seed", type=int)
    parser.add_argument("--chain", action="store_true", help="the seed's chain, not its case")
    arguments = parser.parse_args(argv)
    if arguments.chain:
        scenario, legs = draw_chain(arguments.seed)
        case: Case = (scenario, scenario, tuple(legs))
    else:
        scenario, reference = draw_case(arguments.seed)
        case = (scenario, reference, ())
    attempts = iter(range(10**6))
    with tempfile.TemporaryDirectory(prefix=f"shrink{arguments.seed}-") as scratch:
        smallest, problems = shrink(
            case, lambda each: problems_of(each, Path(scratch), next(attempts)), lambda line: print(line, flush=True)
        )
    if not problems:
        print(f"seed {arguments.seed} passes as drawn: nothing to shrink")
        return 1
    scenario, reference, legs = smallest
    print(f"smallest failing form: {scenario.label()}" + (f": {described(legs)}" if legs else ""))
    if reference != scenario:
        print(f"  compared with: {reference.label()}")
    print("  " + problems[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
