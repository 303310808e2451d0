"""A mixture's weights over the run: constant, or switching at given training steps or samples.

Promise: a `WeightSchedule` is a pure function from a point of the run (a training step, or samples
consumed by all ranks together) to the weights in force there, and it names every point where they
may change, so the stream knows each change before it reaches it (loader workers read ahead). A
`StepClock` converts steps to stream positions: every training step consumes one global batch
(``batch_size * world_size`` samples; a mixture's epochs hold whole global batches), counted from
where the current world size took over.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from lightning_resumable.errors import MixtureError

__all__ = ["StepClock", "Unit", "WeightSchedule", "Weights"]

Weights = Mapping[str, float]
"""A weight per source name (any non-negative numbers; only their ratios count)."""
Unit = Literal["steps", "samples"]


class WeightSchedule:
    """Weights that change during the run, at training steps or at samples consumed.

    A step is one training batch on every rank (the trainer's ``global_step`` with
    ``accumulate_grad_batches=1``); samples are counted over all ranks together. Either give the
    changes, ``{0: first weights, step: weights from that step on, ...}``, or a function of the point
    with ``every``: its weights at each multiple of ``every`` hold until the next one (a curriculum).

    A resume applies the schedule from the checkpoint's point on; what was trained before is the
    checkpoint's (a schedule edited for the past takes effect at the resume, as a change there would).

    Args:
        weights: the changes by point (the first at 0), or a function from a point to the weights.
        unit: ``"steps"`` (the default) or ``"samples"``.
        every: with a function, how often it is read (in ``unit``); the weights between are constant.

    Raises:
        MixtureError: no change at 0, a negative point, a function without ``every`` or changes with it.

    Example:
        ```python
        warm_up = WeightSchedule({0: {"web": 0.9, "code": 0.1}, 5_000: {"web": 0.6, "code": 0.4}})
        ramp = WeightSchedule(lambda step: {"web": 1.0, "code": min(1.0, step / 10_000)}, every=500)
        ```
    """

    def __init__(
        self,
        weights: Mapping[int, Weights] | Callable[[int], Weights],
        *,
        unit: Unit = "steps",
        every: int | None = None,
    ) -> None:
        if unit not in ("steps", "samples"):
            raise MixtureError(f"a schedule's unit is 'steps' or 'samples', got {unit!r}")
        self.unit: Unit = unit
        if callable(weights):
            if every is None or type(every) is not int or every < 1:
                raise MixtureError(f"a schedule given as a function needs every= (a positive int), got {every!r}")
            self._function: Callable[[int], Weights] | None = weights
            self._changes: list[tuple[int, Weights]] = []
        else:
            if every is not None:
                raise MixtureError("every= is for a schedule given as a function; these weights are given by point")
            points = sorted(weights)
            if not points or points[0] != 0 or any(type(point) is not int for point in points):
                raise MixtureError(f"a schedule's changes must be ints from 0 (its first weights), got {points[:8]}")
            self._function, self._changes = None, [(point, weights[point]) for point in points]
        self.every = every

    @classmethod
    def constant(cls, weights: Weights) -> WeightSchedule:
        """The same weights for the whole run."""
        return cls({0: weights})

    def weights_at(self, point: int) -> Weights:
        """The weights in force at ``point`` (in the schedule's unit)."""
        if self._function is not None:
            assert self.every is not None
            return self._function(point // self.every * self.every)
        found = self._changes[0][1]
        for start, weights in self._changes:
            if start > point:
                break
            found = weights
        return found

    def changes_after(self, point: int) -> Iterator[tuple[int, Weights]]:
        """Every later point where the weights may change, with the weights from there on, in order."""
        if self._function is not None:
            assert self.every is not None
            start = (point // self.every + 1) * self.every
            while True:
                yield start, self._function(start)
                start += self.every
        yield from ((start, weights) for start, weights in self._changes if start > point)

    def names(self) -> set[str]:
        """The sources the changes given by point name (a function's are known when it is read)."""
        return {name for _, weights in self._changes for name in weights}


@dataclass(frozen=True)
class StepClock:
    """Where in the stream a training step starts: each step consumes ``samples_per_step`` positions
    from ``anchor_position``, where step ``anchor_step`` began (the run's start, or a resume)."""

    anchor_position: int
    anchor_step: int
    samples_per_step: int

    def position_of(self, point: int, unit: Unit) -> int:
        """The stream position at which ``point`` begins (samples are positions already)."""
        if unit == "samples":
            return point
        return self.anchor_position + (point - self.anchor_step) * self.samples_per_step

    def point_at(self, position: int, unit: Unit) -> int:
        """The point (step, or samples) of the run at which stream ``position`` is trained."""
        if unit == "samples":
            return position
        return self.anchor_step + (position - self.anchor_position) // self.samples_per_step
