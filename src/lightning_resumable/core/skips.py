"""Skipped steps as arithmetic: where a step's data lies in the stream, and the holes a skip leaves.

Promise: the order is a pure function of (seed, epoch, position), so skipping the data of steps ``a`` to
``b`` reads nothing: the positions those steps trained (all ranks together) become a `Hole`, and the run
reads the stream around it. `plan` turns step ranges into holes from where the run stands (its step, epoch
and batch, ``accumulate_grad_batches`` and each epoch's batches, as Lightning counts them); `to_stream` maps a
position the run reads to the stream without holes, so every sample keeps the content, seed and place it
had in the run that spiked. Cost: O(holes) per position map, O(epochs crossed) per planned range.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from lightning_resumable.errors import SkipError
from lightning_resumable.format.skips import Hole, Skip, StepRange, from_stream, hole_of, position_in_stream

__all__ = ["Layout", "from_stream", "length_in", "plan", "position_in_stream", "to_stream"]


def to_stream(holes: Sequence[Hole], epoch: int | None, positions: torch.Tensor) -> torch.Tensor:
    """The positions of the stream without holes that the run's ``positions`` of ``epoch`` read."""
    for hole in reversed(holes):  # each hole is given in the stream the earlier ones left
        if hole_of(hole, epoch) and hole.length:
            positions = torch.where(positions >= hole.start, positions + hole.length, positions)
    return positions


def length_in(holes: Sequence[Hole], epoch: int) -> int:
    """Positions of ``epoch``'s stream its holes take out."""
    return sum(hole.length for hole in holes if hole.epoch == epoch)


@dataclass(frozen=True)
class Layout:
    """How a run's steps lie in its stream, from where it stands.

    Attributes:
        step: the trainer's ``global_step`` where the run stands (the next step to train).
        epoch, batch: the epoch and the batch (Lightning's count in the epoch) that step starts with.
        accumulate: ``accumulate_grad_batches``: a step is that many batches, and the last of an epoch fewer.
        batches_in: the batches one rank trains in an epoch, as Lightning counts them.
        position_of: the position (all ranks together, the run's) of the first sample of an epoch's batch.
        length_of: the positions of an epoch's stream.
        one_stream: the epochs are stretches of one stream (a mixture's), whose holes have no epoch.
    """

    step: int
    epoch: int
    batch: int
    accumulate: int
    batches_in: Callable[[int], int]
    position_of: Callable[[int, int], int]
    length_of: Callable[[int], int]
    one_stream: bool = False

    def place(self, step: int) -> tuple[int, int]:
        """The epoch and batch step ``step`` (at or after the layout's) starts with."""
        epoch, batch, at = self.epoch, self.batch, self.step
        while True:
            batches = self.batches_in(epoch)
            if batches == 0:
                raise SkipError(f"epoch {epoch} holds no batch: the steps after it cannot be placed")
            left = -(-(batches - batch) // self.accumulate)  # the last window of an epoch may be short
            if step < at + left:
                return epoch, batch + (step - at) * self.accumulate
            at, epoch, batch = at + left, epoch + 1, 0

    def step_reading(self, hole: Hole) -> int:
        """The step (at or after the layout's) whose batches read the position where ``hole`` begins, the layout's
        epochs shortened by it: where a run laid out otherwise than the one that named the skip reaches it (a hole
        that takes an epoch's rest is reached by the next epoch's first step). O(log steps) placements."""
        one_stream = self.one_stream or hole.epoch is None  # a position counts from the run's start
        if one_stream:
            target = (0, hole.start)
        else:
            assert hole.epoch is not None
            ends = hole.start >= self.length_of(hole.epoch)
            target = (hole.epoch + 1, 0) if ends else (hole.epoch, hole.start)

        def before(step: int) -> bool:  # step ``step`` starts at or before the hole
            epoch, batch = self.place(step)
            return (0 if one_stream else epoch, self.position_of(epoch, batch)) <= target

        low, high = self.step, self.step + 1  # before(low) holds: the hole lies at or after the origin
        while before(high):
            low, high = high, high + 2 * (high - self.step)
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if before(middle) else (low, middle)
        return low


def plan(ranges: Sequence[StepRange], layout: Layout) -> list[Skip]:
    """The skips of ``ranges`` (sorted, apart, none before ``layout.step``): the holes each leaves, in the
    stream as the earlier ones (these and the run's) left it.

    Raises:
        SkipError: a range that passes over a whole epoch (more than one epoch's end): not supported.
    """
    made: list[Hole] = []
    skips: list[Skip] = []
    for each in ranges:
        (first_epoch, first_batch), (end_epoch, end_batch) = layout.place(each.first), layout.place(each.last + 1)
        start, end = layout.position_of(first_epoch, first_batch), layout.position_of(end_epoch, end_batch)
        if layout.one_stream:
            holes = [Hole(None, start, end - start)]
        elif end_epoch == first_epoch:
            holes = [Hole(first_epoch, start, end - start)]
        elif end_epoch == first_epoch + 1:
            rest = max(0, layout.length_of(first_epoch) - start)
            holes = [Hole(first_epoch, start, rest), Hole(end_epoch, 0, end)]
        else:
            raise SkipError(
                f"the skipped steps {each} start in epoch {first_epoch} and end in epoch"
                f" {layout.place(each.last)[0]}: a range may cross one epoch's end, not pass over a whole epoch"
            )
        placed = []
        for hole in holes:  # in the stream the earlier holes of this plan left (each ends before this one)
            before = sum(h.length for h in made if h.epoch == hole.epoch and h.start + h.length <= hole.start)
            placed.append(Hole(hole.epoch, hole.start - before, hole.length))
        made += holes
        at = each.first - sum(skip.steps.steps for skip in skips)  # the recovered run's step: earlier ones skipped
        skips.append(Skip(each, at, tuple(hole for hole in placed if hole.length)))
    return skips
