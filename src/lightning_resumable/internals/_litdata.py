"""What LitData's loader state shares with the dataset it reads, and never changes in place.

Checked against LitData 0.2.76 (the version CI installs): ``StreamingDataset.state_dict`` hands out the dataset's own
``subsampled_files`` and ``region_of_interest``, lists set when its chunks are listed and only ever replaced whole.
"""

from __future__ import annotations

from typing import Any

__all__ = ["copy_of_loader_state"]

_SET_ONCE = frozenset({"subsampled_files", "region_of_interest"})
"""A dataset's lists of chunks and of their regions: one entry per chunk, replaced whole, never changed in place."""


def copy_of_loader_state(state: Any) -> Any:
    """``state`` (a ``StreamingDataLoader``'s) with its dicts and lists copied, the datasets' lists of chunks and
    regions shared: recorded before every batch, a deep copy of them was a quarter of the library's own time a
    sample (64 chunks)."""
    if isinstance(state, dict):
        return {key: value if key in _SET_ONCE else copy_of_loader_state(value) for key, value in state.items()}
    if isinstance(state, list):
        return [copy_of_loader_state(value) for value in state]
    return state
