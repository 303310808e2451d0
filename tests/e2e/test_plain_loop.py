"""End to end, without Lightning: a plain multi-epoch loop with ``ResumableSampler`` in a
``StatefulDataLoader`` (2 gloo processes, 0 and 2 workers) resumed between epochs trains what the
uninterrupted loop trains. With 0 workers the state after an epoch's end once restored to an empty
pass, and the loop lost an epoch."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from .processes import free_port, run_tree

SCRIPT = Path(__file__).with_name("plain_loop.py")


def batches(out: Path, phase: str, rank: int) -> list[dict[str, object]]:
    return [json.loads(line) for line in (out / f"{phase}.rank{rank}.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_plain_loop_resumed_between_epochs_trains_the_uninterrupted_batches(tmp_path: Path, num_workers: int) -> None:
    command = [sys.executable, str(SCRIPT), str(tmp_path), str(num_workers), str(free_port())]
    log = tmp_path / "loop.log"
    assert run_tree(command, log, tmp_path, 120, "the plain loop") == 0, log.read_text()[-3000:]
    for rank in range(2):
        full = batches(tmp_path, "full", rank)
        assert [batch["epoch"] for batch in full] == [epoch for epoch in range(3) for _ in range(4)]
        assert batches(tmp_path, "stop", rank) + batches(tmp_path, "resume", rank) == full
