"""End to end (2 DDP processes): a checkpoint whose data state was damaged is refused on every rank
before any step trains, never resumed into a wrong stream."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from .harness import Runner, Scenario, run_phase

BASE = Scenario(world_size=2, num_workers=2)


@pytest.mark.parametrize("emptied", [{}, None], ids=["empty-dict", "None"])
def test_an_emptied_data_state_is_refused_on_every_rank(runner: Runner, tmp_path: Path, emptied: object) -> None:
    """Lightning hands no falsy state to the callback: the data restarted at batch 0 while Lightning
    counted from the saved batch, 3 batches repeated and 3 skipped, with only a warning."""
    runner.stopped(BASE)
    checkpoint = torch.load(runner.checkpoint(BASE), weights_only=True)
    checkpoint["callbacks"]["ResumableDataCallback"] = emptied
    damaged = tmp_path / "emptied.ckpt"
    torch.save(checkpoint, damaged)
    resumed = run_phase(BASE, "resume-emptied", tmp_path / "run", damaged, expect_failure=True)
    assert not any(resumed.values()), "a resumed step trained"
    log = (tmp_path / "run" / "resume-emptied.log").read_text()
    for rank in range(BASE.world_size):
        assert (
            f"[rank{rank}]: lightning_resumable.errors.MissingStateError: the checkpoint's data state is empty" in log
        )
