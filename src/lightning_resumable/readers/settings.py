"""A user's loader's settings, carried over to the loader the library builds in its place.

Promise: every reader builds its loader from `forwarded_settings`, so a setting is read from the
user's loader in one place, and a setting torch takes only with workers (``prefetch_factor``,
``persistent_workers``, ``multiprocessing_context``) is passed only then, as torch requires.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["DATA_LIBRARY_SETTINGS", "TORCH_SETTINGS", "forwarded_settings"]

TORCH_SETTINGS = (
    *("batch_size", "num_workers", "collate_fn", "pin_memory", "drop_last", "timeout", "worker_init_fn"),
    *("multiprocessing_context", "generator", "pin_memory_device", "prefetch_factor", "persistent_workers"),
    "in_order",
)
"""What a torch ``DataLoader`` built in place of the user's takes from it."""
DATA_LIBRARY_SETTINGS = (
    *("batch_size", "num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn"),
    *("prefetch_factor", "multiprocessing_context", "persistent_workers"),
)
"""What a data library's own loader (LitData's, Mosaic's) built in place of the user's takes from it."""
_WITH_WORKERS_ONLY = frozenset({"prefetch_factor", "persistent_workers", "multiprocessing_context"})


def forwarded_settings(loader: Any, names: Sequence[str], **overrides: Any) -> dict[str, Any]:
    """``loader``'s settings among ``names`` (one it does not have is left out: torchdata 0.10's
    ``StatefulDataLoader`` has no ``in_order``), then ``overrides``."""
    workers = loader.num_workers > 0
    settings = {
        name: getattr(loader, name)
        for name in names
        if hasattr(loader, name) and (workers or name not in _WITH_WORKERS_ONLY)
    }
    settings.update(overrides)
    return settings
