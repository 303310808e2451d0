"""The world-size policy: one function, which every owner calls on a restore (streams included).

A resume on another number of processes is logged, or refused where the saved state cannot be exact
there (the owner says why) or where the user turned it off (``allow_world_size_change=False``).
"""

from __future__ import annotations

from collections.abc import Callable

from lightning.pytorch.utilities import rank_zero_info

from lightning_resumable.errors import WorldSizeChangedError

__all__ = ["WorldSizePolicy", "check_world_size"]

WorldSizePolicy = Callable[[int, int, "str | None", str], None]
"""The callback's world-size policy, which every owner calls: ``(saved world size, world size now, why
the state cannot resume on another (None: it can), where the state stands)``; raises to refuse a change."""


def check_world_size(
    allowed: bool, saved_world_size: int, world_size: int, inexact_because: str | None, where: str
) -> None:
    """The world-size policy, for every kind of train input (``allowed``: the callback's
    ``allow_world_size_change``): an elastic resume is logged, or refused where it cannot be exact
    (``inexact_because`` says why) or the user turned it off."""
    if saved_world_size == world_size:
        return
    message = f"the checkpoint was written on {saved_world_size} processes and resumes on {world_size}, {where}"
    if inexact_because is not None:
        raise WorldSizeChangedError(f"{message}; {inexact_because}")
    if not allowed:
        raise WorldSizeChangedError(message + "; ResumableDataCallback(allow_world_size_change=False)")
    rank_zero_info(f"lightning_resumable: {message}; the rest of the epoch is split across the new ranks")
