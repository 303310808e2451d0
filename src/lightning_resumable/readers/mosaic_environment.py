"""MosaicML Streaming reads its world from the environment: `set_mosaic_environment` sets it from the
trainer. A module of its own because it must not import Mosaic (`lightning_resumable.readers.mosaic`
does): the datamodule calls it before Mosaic's dataset exists."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["set_mosaic_environment"]


def set_mosaic_environment(trainer: Any) -> None:
    """Set the environment MosaicML Streaming reads its world from (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``NODE_RANK``) to ``trainer``'s (a ``lightning.Trainer``).

    Lightning's own launcher sets only some of them, and a ``StreamingDataset`` built without them
    reads rank 0's samples on every rank. Call it in the DataModule's ``setup()``, before the dataset is
    built; ``torchrun`` sets them already (calling it then changes nothing).
    """
    os.environ.update(
        RANK=str(trainer.global_rank),
        WORLD_SIZE=str(trainer.world_size),
        LOCAL_RANK=str(trainer.local_rank),
        LOCAL_WORLD_SIZE=str(trainer.num_devices),
        NODE_RANK=str(trainer.node_rank),
    )
