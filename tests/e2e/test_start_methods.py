"""End to end, loader workers started by forkserver (Python 3.14's default) and spawn, given to the loaders as their
``multiprocessing_context`` or set as the process default (`train.use_start_method`), keep every promise forked
workers keep (issue 54): a stop and resume is exact (ids, augmentation, loss bits, validations) for a map-style
loader, a mixture (with weights the training sets), a user's stream and a Hugging Face stream through its shuffle
buffer; and a preemption as clusters deliver it (SIGTERM or SLURM's requeue signal to the whole process group: as a
new epoch's workers start, in a validation with workers of its own, in the sanity check) ends every rank at one
step and resumes exactly. The uninterrupted run each is compared with is the forked one (the
start method is not part of a run's data key): how workers start changes nothing they read.

CI runs this module on the newest Python of the machine too (`.ci/newest-python`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .harness import Runner, Scenario
from .preemption import Preemption, run_preemption

EXACT = [
    Scenario(world_size=2, num_workers=2, start_method="spawn"),
    Scenario(world_size=2, num_workers=2, data="mixture", start_method="forkserver", online_mixing=2),
    Scenario(world_size=2, num_workers=2, data="hf", shuffle_buffer=5, start_method="default:forkserver"),
]
"""(A validation with workers of its own, a user's stream, and the rest: the matrices' seeds, which draw the start
method; this module also runs on the newest Python, where nothing is shared with other modules.)"""


@pytest.mark.parametrize("scenario", EXACT, ids=[scenario.label() for scenario in EXACT])
def test_a_stop_and_resume_with_workers_started_without_a_fork_is_exact(runner: Runner, scenario: Scenario) -> None:
    outcome = runner.run(scenario)
    assert outcome.stream_mismatches() == []
    assert outcome.validation_mismatches(runner) == []


PREEMPTED = [
    (
        Scenario(world_size=2, num_workers=2, epochs=2, start_method="spawn"),
        Preemption(when="workers_start", at=(1, 0)),
    ),
    (
        Scenario(world_size=2, num_workers=2, epochs=2, val_workers=2, start_method="forkserver"),
        Preemption(signal="USR1", when="validation", at=(0, 1)),
    ),
    (
        # (Validated at each epoch's end: every validation spawns its loader's workers anew, seconds each.)
        Scenario(
            world_size=2, num_workers=2, epochs=2, val_workers=2, start_method="default:spawn", val_check_interval=1.0
        ),
        Preemption(when="sanity", at=(0, 0), sanity_steps=2),
    ),
]
"""(The process group signalled at a step or a batch's end, to a mixture, by Lightning's launcher: the matrices' seeds,
`examples/preemption.py --start-method` in CI's newest-Python step.)"""


@pytest.mark.parametrize(
    ("scenario", "preemption"),
    PREEMPTED,
    ids=[f"{scenario.label()}-{preemption.label()}" for scenario, preemption in PREEMPTED],
)
def test_a_preemption_of_workers_started_without_a_fork_ends_cleanly_and_resumes_exactly(
    runner: Runner, tmp_path: Path, scenario: Scenario, preemption: Preemption
) -> None:
    outcome = run_preemption(runner, scenario, preemption, tmp_path / "run")
    assert outcome.problems == []
