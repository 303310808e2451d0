"""End to end (2 DDP processes): a checkpoint whose data state was damaged is refused on every rank
before any step trains, never resumed into a wrong stream."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .harness import Runner, Scenario, resume_damaged, stream_state

BASE = Scenario(world_size=2, num_workers=2)


@pytest.mark.parametrize("emptied", [{}, None], ids=["empty-dict", "None"])
def test_an_emptied_data_state_is_refused_on_every_rank(runner: Runner, tmp_path: Path, emptied: object) -> None:
    """Lightning hands no falsy state to the callback: the data restarted at batch 0 while Lightning
    counted from the saved batch, 3 batches repeated and 3 skipped, with only a warning."""
    log = resume_damaged(runner, BASE, tmp_path, lambda c: c["callbacks"].update(ResumableDataCallback=emptied))
    for rank in range(BASE.world_size):
        assert (
            f"[rank{rank}]: lightning_resumable.errors.MissingStateError: the checkpoint's data state is empty" in log
        )


STREAM = Scenario(world_size=2, num_workers=2, loader="StatefulDataLoader", data="stream", stop_kind="batch_end")


def test_swapped_stream_states_are_refused_on_every_rank_naming_the_ranks(runner: Runner, tmp_path: Path) -> None:
    """Each rank of a stream restores its own state from the checkpoint: with rank 0's and rank 1's states
    swapped, each read the other's shard on, silently (a stream's batch cannot be re-fetched from a state).
    Each rank's first resumed batch is now compared with the digest it recorded, before it trains."""

    def swap(checkpoint: dict[str, Any]) -> None:
        stream = stream_state(checkpoint)
        assert stream["next_batch"][0] != stream["next_batch"][1] != ""
        stream["ranks"].reverse()

    log = resume_damaged(runner, STREAM, tmp_path, swap)
    for rank in range(STREAM.world_size):
        assert f"[rank{rank}]: lightning_resumable.errors.ResumeVerificationError: the first batch after" in log
    assert "rank 0 read a batch with digest" in log and "rank 1 read a batch with digest" in log


def test_an_emptied_stream_state_of_one_rank_is_refused_on_every_rank(runner: Runner, tmp_path: Path) -> None:
    """torchdata restores a loader state of ``{}`` without an error and reads the stream from its start. Every
    rank checks every rank's state against torchdata's structure, so all refuse, not only rank 1 (which
    would leave rank 0 waiting in its first collective)."""
    log = resume_damaged(
        runner, STREAM, tmp_path, lambda checkpoint: stream_state(checkpoint)["ranks"].__setitem__(1, {})
    )
    for rank in range(STREAM.world_size):
        assert f"[rank{rank}]: lightning_resumable.errors.StateFormatError: rank 1's stream loader state lacks" in log
