"""The augmentation libraries users have resume exactly (2 DDP processes, 2 workers, a mid-epoch save):
per rank and step the ids, three statistics of the augmented pixels and the loss bits are the
uninterrupted run's.

albumentations' ``Compose`` draws from generators of its own, seeded once (from ``seed``, or from
entropy) and advanced by every sample a worker transforms; the library reseeds them per sample by
where they sit (`lightning_resumable.core.held_generators`). So does a dataset's own ``torch.Generator``.
kornia draws from torch's global generator, which the library seeds per sample (a guard: it was
exact before). A generator the library cannot reach is refused by the self-check, which compares the
batch the workers produce after the resume with the one they produced uninterrupted.

Needs the ``augment`` extra (albumentations, kornia); CI installs it, elsewhere the module skips.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import replace

import pytest

from .harness import Runner, Scenario

if os.environ.get("LIGHTNING_RESUMABLE_REQUIRE_INSTALLED") == "1":  # CI: missing is a failure, not a skip
    importlib.import_module("albumentations")
    importlib.import_module("kornia")
else:
    pytest.importorskip("albumentations")
    pytest.importorskip("kornia")

IMAGES = Scenario(world_size=2, num_workers=2, dataset_size=48, epochs=2)


@pytest.mark.parametrize("augment", ["albumentations-seeded", "albumentations", "own-generator", "kornia"])
def test_augmented_pixels_and_losses_resume_exactly(runner: Runner, augment: str) -> None:
    outcome = runner.run(replace(IMAGES, augment=augment))
    assert outcome.stream_mismatches() == []


def test_a_generator_out_of_reach_is_refused_before_the_first_resumed_step(runner: Runner) -> None:
    """A module-level generator, advanced by each worker's samples: the workers' batch after the resume
    is not the one they produced uninterrupted. The main process's re-fetch agrees with itself at the
    save and at the resume; only the workers' batches show it."""
    scenario = replace(IMAGES, augment="out-of-reach")
    resumed = runner.resumed(scenario, expect_failure=True)
    assert resumed == {0: [], 1: []}, "a resumed step trained on other content"
    log = next(runner.root.joinpath(scenario.label()).glob("resume-*.log")).read_text()
    assert "ResumeVerificationError" in log, log[-3000:]
    assert "the batch the workers produced" in log, log[-3000:]
