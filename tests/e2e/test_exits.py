"""Runs that end as a user's process does: ``python train.py``, a normal interpreter exit, within a
timeout (else every process's stack is printed and the tree killed). Each run stops at ``max_steps``
inside an epoch, so its train loader's iterator is not exhausted and its workers still run: at the
interpreter's exit multiprocessing joins them, and a worker never shut down keeps the rank (and a
SLURM allocation) alive for ever. The suite's other runs end with ``os._exit``, which would hide it.

Here the loaders the library builds for map-style datasets and for a stream (a Hugging Face stream is
read through the same one); LitData's and Mosaic's in their own modules (``test_litdata.py``,
``test_mosaic.py``).
"""

from __future__ import annotations

import pytest

from .harness import Scenario, check_run_exits


@pytest.mark.parametrize("data", ["map", "stream"])
def test_a_run_stopped_by_max_steps_with_workers_exits_on_its_own(
    tmp_path_factory: pytest.TempPathFactory, data: str
) -> None:
    check_run_exits(tmp_path_factory.mktemp("exits"), Scenario(world_size=2, num_workers=2, data=data))
