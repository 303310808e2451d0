"""Reading a checkpoint file safely: ``torch.load(weights_only=True)``, so no arbitrary object is unpickled."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from lightning_resumable.errors import MissingStateError
from lightning_resumable.format.envelope import STATE_KEY

__all__ = ["Unreadable", "load_data_state"]


class Unreadable(Exception):
    """The file is not a checkpoint that can be read safely."""


def load_data_state(path: Path) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """The checkpoint (read with ``weights_only=True``) and the raw data state it holds.

    Raises:
        Unreadable: no such file, or not loadable without unpickling arbitrary objects.
        MissingStateError: the checkpoint holds no data state of this library.
    """
    if not path.is_file():
        raise Unreadable(f"{path}: no such file")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises UnpicklingError, RuntimeError, EOFError... for what it refuses
        raise Unreadable(
            f"{path} cannot be read as a checkpoint with torch.load(weights_only=True), which loads no arbitrary"
            f" objects: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        ) from error
    callbacks = checkpoint.get("callbacks") if isinstance(checkpoint, Mapping) else None
    raw = callbacks.get(STATE_KEY) if isinstance(callbacks, Mapping) else None
    if not raw:
        raise MissingStateError(
            f"{path} holds no data state of lightning-resumable: it was written without ResumableDataCallback"
            " (or before the train loader was built)"
        )
    return checkpoint, raw
