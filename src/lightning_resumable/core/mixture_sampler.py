"""The sampler of a `Mixture`: a `ResumableSampler` over the mixture's stream.

Promise: an epoch is a stretch of the stream that holds whole global batches (``samples_per_epoch``
rounded up to a multiple of ``batch_size * world_size``, from where the epoch's world size took
over), so no rank is padded and no sample is dropped: the stream is trained position after
position, each once, across epochs, resumes and world sizes. Within a global batch each rank takes a
block of consecutive positions (not every ``W``-th, as ``DistributedSampler`` does), so each rank's
batch holds the sources in proportion, not only the global batch. Each sample's seed is keyed by its
stream position, so a sample's augmentation is the same in any run that trains that position.
"""

from __future__ import annotations

from typing import Any

import torch

from lightning_resumable.core.draws import Draws
from lightning_resumable.core.mixture import Mixture
from lightning_resumable.core.mixture_stream import MixtureStream, Segment, realise
from lightning_resumable.core.randomness import sample_seeds
from lightning_resumable.core.sampler import ResumableSampler
from lightning_resumable.core.schedule import StepClock
from lightning_resumable.core.skips import from_stream, position_in_stream, to_stream
from lightning_resumable.format.state import DataState

__all__ = ["MIXTURE_DRAWS", "MixtureSampler"]

MIXTURE_DRAWS = "mixture"
"""What a mixture's `DataState` records as its draws (the sources and weights are the mixture record's)."""


class _MixtureDraws(Draws):
    """The mixture's epochs as `ResumableSampler` sees them: ``samples_per_epoch`` positions each."""

    def __init__(self, samples_per_epoch: int) -> None:
        self.length = self.dataset_size = samples_per_epoch

    def describe(self) -> str:
        return MIXTURE_DRAWS


def whole_batches(samples: int, global_batch: int) -> int:
    """``samples`` rounded up to whole global batches."""
    return -(-max(0, samples) // global_batch) * global_batch


class MixtureSampler(ResumableSampler):
    """Exactly resumable sampler of a `Mixture`'s stream, split across ranks as ``DistributedSampler`` splits.

    Args:
        mixture: the mixture (its ``len`` is ``samples_per_epoch``).
        num_replicas, rank, seed, batch_size, sample_keys: as `ResumableSampler`'s.
    """

    def __init__(
        self,
        mixture: Mixture,
        num_replicas: int,
        rank: int,
        seed: int,
        batch_size: int,
        sample_keys: bool = True,
    ) -> None:
        draws = _MixtureDraws(len(mixture))
        super().__init__(mixture, num_replicas, rank, mixture.shuffle, seed, False, batch_size, draws, sample_keys)
        self.shuffle = mixture.shuffle
        self.passes = "once"  # the stream goes on: an epoch read to its end is not read again
        self.mixture = mixture
        self._epoch_origin = (0, 0)  # (epoch, stream position of its first sample)
        self._stream: MixtureStream | None = None  # a fresh run's, made when first read (a restore brings its own)

    @property
    def stream(self) -> MixtureStream:
        """The mixture's stream this sampler reads: a fresh run's from position 0, or a restore's."""
        if self._stream is None:
            mixture = self.mixture
            parts, period = realise(mixture.schedule.weights_at(0), mixture.names, "at the start")
            first = Segment(0, period, parts, tuple((name, 0) for name in sorted(mixture.names)))
            self._stream = self.make_stream(first, StepClock(0, 0, self.global_batch), 0)
        return self._stream

    @stream.setter
    def stream(self, stream: MixtureStream) -> None:
        self._stream = stream

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.num_replicas

    def make_stream(
        self, first: Segment, clock: StepClock, changes_after: int, scheduled: bool = True
    ) -> MixtureStream:
        """The stream from ``first`` on, changing as the mixture's schedule says after ``changes_after``
        (``scheduled=False``: never, as a resume's first batch is verified)."""
        mixture = self.mixture
        schedule = mixture.schedule if scheduled else None
        chunks = tuple(mixture.chunks.get(name) for name in mixture.names)
        return MixtureStream(
            mixture.names, mixture.sizes, self.seed, mixture.shuffle, first, schedule, clock, changes_after, chunks
        )

    def set_samples_per_epoch(self, samples: int) -> None:
        """The nominal length of an epoch (a resume keeps the checkpoint's)."""
        self.draws = _MixtureDraws(samples)
        self.dataset_size = samples

    def start_at(self, epoch: int, epoch_start: int, stream: MixtureStream) -> None:
        """Read ``stream``, ``epoch`` beginning at stream position ``epoch_start`` (before a restore into it)."""
        self.stream, self.epoch, self._epoch_origin = stream, epoch, (epoch, epoch_start)

    # ------------------------------------------------------------------------------- epochs
    @property
    def stream_length(self) -> int:
        """Positions in the current epoch: whole global batches from where its world size took over."""
        anchor = self._anchor[0] or 0
        return anchor + whole_batches(self.draws.length - anchor, self.global_batch)

    def epoch_start(self, epoch: int) -> int:
        """The stream position of ``epoch``'s first sample (the current epoch, or a later one)."""
        current, start = self._epoch_origin
        if epoch < current:
            raise ValueError(f"epoch {epoch} lies before the mixture's current epoch {current}")
        if epoch == current:
            return start
        return start + self.stream_length + (epoch - current - 1) * whole_batches(self.draws.length, self.global_batch)

    def set_epoch(self, epoch: int) -> None:
        start = self.epoch_start(epoch) if epoch >= self._epoch_origin[0] else None
        super().set_epoch(epoch)
        if start is None:  # a run started at a later epoch without a state: as an uninterrupted one would be
            start = epoch * whole_batches(self.draws.length, self.global_batch)
        self._epoch_origin = (epoch, start)

    def restore(self, saved: DataState, batch_size_may_change: bool = False) -> None:
        """After `start_at` (the owner's), which sets the saved epoch: an epoch's end is saved as the next
        epoch's start, so the base class's "the loop has begun the next epoch" case never arises here."""
        start = self.epoch_start(saved.epoch)
        super().restore(saved, batch_size_may_change)
        self._epoch_origin = (saved.epoch, start)

    def state_at_start(self, epoch: int, cycle: int) -> DataState:
        return self.data_state().at_start(epoch, cycle, whole_batches(self.draws.length, self.global_batch))

    # ----------------------------------------------------------------- changes set by the training
    def batch_position(self, batch: int) -> int:
        """The stream position of the first sample of global batch ``batch`` of the current epoch (the
        trainer's count: after a restore on another world size, the batches before it in the old size's)."""
        trained = self._origin_position + (batch - self._origin_batches) * self.global_batch
        return position_in_stream(self.holes, None, self.epoch_start(self.epoch) + trained)

    @property
    def first_batch(self) -> int:
        """The trainer's count of the first batch this epoch's pass reads (after a restore, the restored one)."""
        return self._origin_batches

    def _element_at(self, position: int) -> int:
        """The place in this rank's pass of its first sample at or after stream ``position``."""
        offset = from_stream(self.holes, None, position) - self.epoch_start(self.epoch) - self._origin_position
        batch, within = divmod(max(0, offset), self.global_batch)
        own = self.rank * self.batch_size
        return batch * self.batch_size + min(max(0, within - own), self.batch_size)

    def read_before(self, position: int) -> bool:
        """Whether this rank's loader has read nothing at or after stream ``position`` yet (its workers
        and the trainer's prefetch included: what the sampler handed out)."""
        if self._handed_out.of != (self.epoch, self._origin_position):
            return True  # the current epoch's pass has not begun
        return self._handed_out.count() <= self._element_at(position)

    def change_weights(self, position: int, parts: tuple[tuple[str, int], ...], period: int) -> None:
        """The weights ``parts / period`` from stream ``position`` on, which this rank has not read yet:
        the pass's indices computed ahead from there are computed again."""
        if not self.read_before(position):
            raise ValueError(f"stream position {position} was read already")
        self.stream.add_change(position, parts, period)
        if self._handed_out.of == (self.epoch, self._origin_position):
            cut = self._element_at(position)
            if cut < self._handed_out.end():
                self._handed_out.cut(cut)

    def window_start(self, position: int, batches: int) -> int:
        """The first stream position at or after ``position`` (a batch's start, in this epoch or a later
        one) where a window of ``batches`` batches of its epoch begins, as the trainer counts an epoch's
        batches from 0 (``accumulate_grad_batches``); positions of the stream, the run's skipped data counted."""
        found = self._window_start(from_stream(self.holes, None, position), batches)
        return position_in_stream(self.holes, None, found)

    def _window_start(self, position: int, batches: int) -> int:
        epoch = self.epoch
        while position >= self.epoch_start(epoch + 1):
            epoch += 1
        start = self.epoch_start(epoch)
        first = self._origin_batches if epoch == self.epoch else 0  # the trainer's count of its first batch here
        origin = start + (self._origin_position if epoch == self.epoch else 0)
        batch = first + -(-(position - origin) // self.global_batch)
        batch = -(-batch // batches) * batches
        found = origin + (batch - first) * self.global_batch
        return found if found < self.epoch_start(epoch + 1) else self.epoch_start(epoch + 1)

    # ---------------------------------------------------------------------------- the stream
    def stream_position(self, position: int) -> int:
        """The stream position of ``position`` of the current epoch."""
        return position_in_stream(self.holes, None, self.epoch_start(self.epoch) + position)

    def _chunk_between(self, start: int, stop: int) -> list[Any]:
        """This rank's samples at its places ``start, start + W, ... < stop`` (as `ResumableSampler` counts
        them from the origin), laid out in blocks: within each global batch, rank ``r`` takes the
        ``batch_size`` consecutive positions after ``r`` batches, so each rank's batch is a window of the
        interleave, in proportion as the whole global batch is."""
        places = torch.div(
            torch.arange(start, stop, self.num_replicas) - self._origin_position - self.rank,
            self.num_replicas,
            rounding_mode="floor",
        )
        batches, within = torch.div(places, self.batch_size, rounding_mode="floor"), places % self.batch_size
        positions = self._origin_position + batches * self.global_batch + self.rank * self.batch_size + within
        positions = to_stream(self.holes, None, positions + self.epoch_start(self.epoch))  # skipped data passed over
        indices = self.stream.indices(positions).tolist()
        if not self.sample_keys:
            return list(indices)
        seeds = sample_seeds(self.seed, 0, positions).tolist()  # keyed by the stream position, not the epoch's
        return list(zip(indices, seeds, strict=True))
