"""A Fabric loop on 2 DDP processes (gloo), stopped mid-epoch with ``fabric.save`` and resumed with
``fabric.load`` and `restore_loader`: ``examples/fabric_loop.py`` compares every rank's ids and loss
bits, step for step, with an uninterrupted run, and exits 1 unless they are identical."""

from __future__ import annotations

import sys
from pathlib import Path

from . import processes
from .harness import RUN_TIMEOUT_S

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fabric_loop.py"


def test_the_fabric_example_resumes_every_rank_exactly(tmp_path: Path) -> None:
    log = tmp_path / "example.log"
    code = processes.run_tree([sys.executable, str(EXAMPLE)], log, tmp_path, 3 * RUN_TIMEOUT_S, "the Fabric example")
    output = log.read_text()
    assert code == 0 and "VERDICT: EXACT" in output, output[-4000:]
    for rank in range(2):
        assert f"rank {rank}: 15 steps uninterrupted; stopped after 8, resumed 7; ids and losses identical" in output
