"""Spellings of 0.2.0 kept for one release (deprecated in 0.3.0, removed in 0.4.0), each warning with
its replacement."""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["DeprecatedSpellings"]


class DeprecatedSpellings:
    """`lightning_resumable.ResumableSampler`'s methods of 0.2.0."""

    _declared: tuple[Any, int] | None = None  # set_consumed_batches's (the sampler's origin then, the count)
    origin: Any

    def data_state(self, batches: int | None = None) -> Any:
        raise NotImplementedError

    def set_consumed_batches(self, batches: int) -> None:
        """Deprecated since 0.3.0, removed in 0.4.0: pass the count to ``state_dict(batches)``.

        The next ``state_dict()`` without a count, in this pass, is the state after ``batches`` batches.
        """
        warnings.warn(
            "ResumableSampler.set_consumed_batches(n) is deprecated and will be removed in 0.4.0: pass the trained"
            " batches to state_dict(batches=n)",
            DeprecationWarning,
            stacklevel=2,
        )
        self.data_state(batches)  # refuses a count before the restored position, as state_dict(batches) does
        self._declared = (self.origin, batches)

    def declared_batches(self) -> int | None:
        """The count `set_consumed_batches` declared in this pass, if any."""
        declared = self._declared
        return declared[1] if declared is not None and declared[0] == self.origin else None
