"""Spellings kept for one release, each warning with its replacement: 0.2.0's (deprecated in 0.3.0) and
``allow_inexact_streams`` (deprecated after 0.3.0), removed in 0.4.0."""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["DeprecatedSpellings", "warn_if_inexact_streams_allowed"]


def warn_if_inexact_streams_allowed(allowed: bool) -> None:
    """``ResumableDataCallback(allow_inexact_streams=True)``: the one stream it accepted (a Hugging Face
    stream with a shuffle buffer) resumes exactly since issue 46, so it has no effect."""
    if allowed:
        warnings.warn(
            "ResumableDataCallback(allow_inexact_streams=...) is deprecated, has no effect and will be removed in"
            " 0.4.0: a Hugging Face stream with a shuffle buffer, the stream it accepted, now resumes exactly",
            DeprecationWarning,
            stacklevel=3,
        )


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
