"""The strategies that restore the checkpoint after ``setup`` (FSDP, ``ModelParallelStrategy``, DeepSpeed),
with a schedule sized by ``trainer.estimated_stepping_batches``, which builds the train loader during
``setup``, before the restore: exact, with full and distributed (sharded) checkpoints.

Tested with ``ModelParallelStrategy`` and FSDP2's ``fully_shard`` on 2 CPU processes (gloo);
``FSDPStrategy`` and ``DeepSpeedStrategy`` need a GPU and share its restore order
(``restore_checkpoint_after_setup``), so the same code path covers them.
"""

from __future__ import annotations

import pytest

from .harness import Runner, Scenario

SHARDED = {
    strategy: Scenario(world_size=2, num_workers=2, strategy=strategy, estimated_stepping_batches=True)
    for strategy in ("model_parallel", "model_parallel_sharded")
}


@pytest.mark.parametrize("strategy", list(SHARDED))
def test_a_restore_after_setup_with_estimated_stepping_batches_resumes_exactly(runner: Runner, strategy: str) -> None:
    outcome = runner.run(SHARDED[strategy])
    assert outcome.stream_mismatches() == []
    assert outcome.validation_mismatches(runner) == []
