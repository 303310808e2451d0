"""A distributed sampler whose stream is a pure function of (seed, epoch, position, world size).

Promise: `ResumableSampler` yields on each rank exactly what torch's ``DistributedSampler``
layout would (rank ``r`` takes every ``world_size``-th element of the epoch's stream, the tail padded
by wrapping around or dropped), and it can start that stream at any global position of any epoch in
O(1) time and memory, without replaying earlier positions or epochs.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sized
from typing import Any, Literal

import torch
from torch.utils.data import DistributedSampler

from lightning_resumable.core.deprecated import DeprecatedSpellings
from lightning_resumable.core.draws import Draws, Permutation
from lightning_resumable.core.order import MAX_SIZE, one_thread
from lightning_resumable.core.passes import HandedOut, SamplerPass
from lightning_resumable.core.randomness import SampleKey, keyed_batches, sample_seeds
from lightning_resumable.core.resume_start import DataPlace, Start, resume_start
from lightning_resumable.core.skips import length_in, to_stream
from lightning_resumable.errors import PendingRestoreError
from lightning_resumable.format._keys import cycle_seed
from lightning_resumable.format.skips import Hole
from lightning_resumable.format.state import DataState

__all__ = ["ResumableSampler"]

Passes = Literal["repeat", "cycle", "once"]
"""What a pass of an epoch after a complete one yields (see `ResumableSampler`)."""
_FIRST_CHUNK = 256
_CHUNK = 65536
"""Positions computed per vectorised step: amortising torch's per-call cost, in cache. The first chunks are
smaller (from ``_FIRST_CHUNK``, growing fourfold) so the first batch after a restore costs microseconds."""


class ResumableSampler(DeprecatedSpellings, DistributedSampler[Any]):
    """Exactly resumable replacement for ``DistributedSampler``.

    The epoch's stream is its ``draws`` keyed by ``(seed, epoch)``: a permutation (`EpochOrder`) by
    default, or a weighted, with-replacement or subset sampler's draws, or a batch sampler's batches
    (`lightning_resumable.core.draws`, `lightning_resumable.core.batches`). The persisted position is global
    (samples consumed by all ranks), so a state written on ``W`` processes restores on ``W'``, every
    remaining sample of the epoch once (plus ``DistributedSampler``-style padding unless ``drop_last``).

    Consumption is what the trainer has trained on, not what workers prefetched: pass the trained batches to
    ``state_dict(batches)`` (``ResumableDataCallback`` does); else it counts the indices handed out (no prefetch).

    Args:
        dataset: a sized dataset.
        num_replicas: world size; from ``torch.distributed`` when ``None``.
        rank: this process's rank; from ``torch.distributed`` when ``None``.
        shuffle: shuffle the order each epoch.
        seed: the shuffle seed; part of the persisted state.
        drop_last: drop the tail that does not divide evenly across ranks instead of padding.
        batch_size: samples per batch on each rank; converts the trainer's batch counts to positions.
        draws: what the epoch's stream draws (`lightning_resumable.core.draws`); ``None`` is a permutation
            of the dataset (the identity without ``shuffle``). Given draws, ``shuffle`` is theirs.
        sample_keys: yield ``(index, sample seed)`` pairs, the seed derived from ``(seed, epoch, global
            position)``, for a `SampleSeededDataset` to fetch each sample under its own seed.
        drop_last_batch: the loader's ``drop_last``, recorded so that a resume with another is refused.
        passes: what a pass after a complete one yields: ``"repeat"`` the epoch's order again (as torch's), ``"cycle"``
            the next cycle (keyed by ``(seed, epoch, cycle)``), ``"once"`` nothing (after one begun mid-epoch).

    A restore (`load_state_dict`) applies to the next pass only; a state saved after the epoch's last sample restores
    to an empty pass (the epoch's rest), or in a ``StatefulDataLoader`` run out, the next (`core.passes`).

    Example:
        ```python
        sampler = ResumableSampler(dataset, num_replicas=2, rank=0, seed=42, batch_size=8)
        loader = DataLoader(dataset, batch_size=8, sampler=sampler)
        state = sampler.state_dict(batches=10)  # 10 batches trained: {"epoch": 0, "position": 160, ...}
        sampler.load_state_dict(state)  # after the restart, before iterating
        ```
    """

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        batch_size: int = 1,
        draws: Draws | None = None,
        sample_keys: bool = False,
        drop_last_batch: bool = False,
        passes: Passes = "repeat",
    ) -> None:
        super().__init__(dataset, num_replicas, rank, shuffle, seed, drop_last)  # type: ignore[arg-type]  # any Sized
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if len(dataset) > MAX_SIZE:
            raise ValueError(f"datasets of up to 2**40 samples are supported, got {len(dataset)}")
        self.batch_size, self.drop_last_batch = batch_size, drop_last_batch
        self.passes: Passes = passes
        self.dataset_size = len(dataset)
        self.draws = draws if draws is not None else Permutation(self.dataset_size, shuffle)
        self.shuffle = self.draws.describe() != "sequential"  # one source of truth: the draws
        if self.draws.dataset_size > self.dataset_size:
            raise ValueError(
                f"the draws ({self.draws.describe()}) index {self.draws.dataset_size} samples, but the dataset"
                f" holds {self.dataset_size}"
            )
        self.sample_keys = sample_keys
        self.holes: tuple[Hole, ...] = ()  # the stretches skipped steps took out of the stream (`core.skips`)
        # Where the current (or next) pass's stream starts: 0 fresh, else the restored position and its batch count
        self._origin_position, self._origin_batches, self._origin_is_restored = 0, 0, False
        # Where this world size took over the epoch's stream: the origin after a restore on another world
        # size, else the saved anchor ((None, None): not recorded), else the stream's start.
        self._anchor: tuple[int | None, int | None] = (0, 0)
        self._restored_pass: int | None = None  # the pass a restore was loaded into (torchdata's protocol)
        self._passes_made = 0
        self.cycle = 0
        self._pass_complete = False  # the current pass ran to its end: the next one is the next cycle
        self._handed_out = HandedOut()

    # ----------------------------------------------------------------------------------- epochs
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch. A new epoch starts at position 0; the current one keeps its position. Between a
        restore and its pass, only the restored epoch is accepted (or the next one, where a resume starts it:
        `resume_start`); another would silently drop the restore.

        Raises:
            PendingRestoreError: ``epoch`` would drop a restored position not yet iterated.
        """
        if epoch < 0:
            raise ValueError(f"epoch must be non-negative, got {epoch}")
        restored_elsewhere = self._origin_is_restored and epoch != self.epoch
        if restored_elsewhere and not self._next_epoch_starts(epoch):
            raise PendingRestoreError(
                f"set_epoch({epoch}) after a restore of epoch {self.epoch} at position {self._origin_position}"
                f" would start epoch {epoch} from its beginning and drop the restored position. Under Fabric,"
                " setup_dataloaders calls set_epoch(number of passes) on every pass: restore the loader with"
                " lightning_resumable.fabric.restore_loader(loader, state)"
            )
        if epoch != self.epoch:
            self.epoch = epoch
            self.cycle, self._pass_complete = 0, False
            self._start_fresh_pass()

    def _next_pass(self) -> None:
        if self.passes == "cycle":
            self.cycle += 1
        self._start_fresh_pass()

    def _start_fresh_pass(self) -> None:
        self._origin_position, self._origin_batches, self._origin_is_restored, self._anchor = 0, 0, False, (0, 0)
        self._from_start = True  # the pass begins at its epoch's start (fresh, or restored there: `_chunks`)

    # -------------------------------------------------------------------------------- iteration
    @property
    def stream_seed(self) -> int:
        """The key of the current cycle's stream: the run's seed for the first cycle of an epoch."""
        return self.seed if self.cycle == 0 else cycle_seed(self.seed, self.cycle)

    @property
    def stream_length(self) -> int:
        """Positions in the current epoch's global stream (samples, or batches for a batch sampler), holes out."""
        return self.epoch_length(self.epoch, self.stream_seed)

    def epoch_length(self, epoch: int, seed: int | None = None) -> int:
        """Positions in ``epoch``'s global stream (its first cycle's, or the one ``seed`` keys) without its holes."""
        return self.draws.epoch_length(self.seed if seed is None else seed, epoch) - length_in(self.holes, epoch)

    def _samples_per_rank(self) -> int:
        """Samples this rank yields from the origin to the end of the epoch."""
        remaining = max(0, self.stream_length - self._origin_position)
        return remaining // self.num_replicas if self.drop_last else -(-remaining // self.num_replicas)

    def __len__(self) -> int:
        """The epoch's length on this rank as the trainer counts it.

        After a restore on another world size the batches before the origin count in the old
        world size's units, so the trainer's epoch ends exactly when the remaining samples do.
        """
        return self._origin_batches * self.batch_size + self._samples_per_rank()

    def _chunks(self, number: int) -> Iterator[Iterator[int | SampleKey]]:
        """Iterators over consecutive chunks of this rank's indices, computed one vectorised pass each."""
        if self._origin_is_restored and self._restored_pass not in (None, number):
            # torchdata dropped the pass it restored (the saved iterator had run out): this pass follows it
            self._start_fresh_pass()
            self._pass_complete, self._from_start = True, False
        if self._origin_is_restored:
            # This pass starts at the restored position (a complete epoch's: its empty rest, as torchdata's
            # StatefulDistributedSampler yields, so a loop that saves after every step trains nothing twice).
            at_start = self._origin_position == self._origin_batches == 0
            self._origin_is_restored, self._from_start = False, at_start
        elif self._pass_complete:
            # Lightning's reload makes an iterator it never reads, then another: a pass begun at the start is read again
            if self.passes == "once" and not self._from_start:
                return  # read once this epoch
            self._next_pass()  # a restart within the epoch
        else:
            self._start_fresh_pass()
        self._pass_complete, self._handed_out = False, HandedOut((self.epoch, self._origin_position))
        stride, start = self.num_replicas, self._origin_position + self.rank
        stop = start + self._samples_per_rank() * stride
        if stop <= start:
            self._pass_complete = True
            return  # an empty dataset, or nothing left for this rank
        chunk_start, chunk_size = start, _FIRST_CHUNK
        while chunk_start < stop:
            chunk_stop = min(chunk_start + chunk_size * stride, stop)
            with one_thread():
                chunk = self._chunk_between(chunk_start, chunk_stop)
            yield self._handed_out.add(chunk)
            chunk_start = start + self._handed_out.end() * stride  # before chunk_stop if the chunk was cut
            chunk_size = min(chunk_size * 4, _CHUNK) if chunk_start == chunk_stop else _FIRST_CHUNK
        self._pass_complete = True

    def _chunk_between(self, start: int, stop: int) -> list[Any]:
        """This rank's indices (or keys, or batches) at global positions ``start, start + W, ... < stop``."""
        unwrapped = torch.arange(start, stop, self.num_replicas)
        # Seeds are keyed by the position before padding wraps it, so a padded repeat of an index
        # draws other augmentations than its first occurrence; both in the stream without holes.
        wrapped = to_stream(self.holes, self.epoch, self._wrapped(unwrapped))
        unwrapped = to_stream(self.holes, self.epoch, unwrapped)
        drawn = self.draws(self.stream_seed, self.epoch, wrapped)
        if not isinstance(drawn, torch.Tensor):  # a batch sampler's stream: each position is a whole batch
            return keyed_batches(self.stream_seed, self.epoch, drawn, unwrapped) if self.sample_keys else drawn
        indices = drawn.tolist()
        if not self.sample_keys:
            return list(indices)
        return list(zip(indices, sample_seeds(self.stream_seed, self.epoch, unwrapped).tolist(), strict=True))

    def _wrapped(self, positions: torch.Tensor) -> torch.Tensor:
        """Padding wraps around to the start of the epoch's stream, as ``DistributedSampler``'s does."""
        length = self.stream_length
        if len(positions) and positions[-1] >= length:
            return torch.where(positions >= length, positions % length, positions)
        return positions

    def __iter__(self) -> SamplerPass:
        # Lazy until the first next(): torch's multi-worker iterator calls iter() twice, uses the second.
        self._passes_made += 1
        number = self._passes_made
        return SamplerPass(self._chunks(number), self.state_dict, functools.partial(self._restore_into, number))

    def batch_indices(self, batch: int) -> list[int]:
        """The dataset indices of this rank's batch number ``batch`` of the current epoch (and cycle).

        Read from the chunks this pass handed out last (a few microseconds), else computed from the
        stream (a few draws, about 100 µs). For a batch sampler's stream, the indices of that batch.
        """
        first = (batch - self._origin_batches) * self.batch_size  # counted from the origin of this pass
        elements = self._handed_out.find(first, self.batch_size)
        if elements is None:
            stride, start = self.num_replicas, self._origin_position + self.rank
            stop = min(start + (first + self.batch_size) * stride, start + self._samples_per_rank() * stride)
            with one_thread():
                elements = self._chunk_between(start + first * stride, stop) if stop > start + first * stride else []
        if elements and isinstance(elements[0], list):  # a batch sampler's stream: a position is a batch
            elements = elements[0]
        return [element[0] if isinstance(element, tuple) else element for element in elements]

    # ------------------------------------------------------------------------------------ state
    def data_state(self, batches: int | None = None) -> DataState:
        """The state after ``batches`` batches of the current epoch were trained, as the trainer counts
        them (from the epoch's start, batches before a restore included); ``None``: the indices handed
        out, which alone carry no anchor. A ``ValueError`` if fewer than the batches at the restored position.
        """
        anchor: tuple[int | None, int | None] = (None, None)
        if batches is None:
            handed_out = self._handed_out.count()
            position = self._origin_position + handed_out * self.num_replicas
            batches = self._origin_batches + handed_out // self.batch_size
        elif batches < self._origin_batches:
            raise ValueError(f"consumed batches ({batches}) cannot be fewer than the restored ({self._origin_batches})")
        else:
            position = self._origin_position + (batches - self._origin_batches) * self.batch_size * self.num_replicas
            anchor = self._anchor
        return self._state(position, batches, anchor, self.stream_length)

    def _state(
        self, position: int, batches: int, anchor: tuple[int | None, int | None], stream_length: int | None
    ) -> DataState:
        return DataState(
            seed=self.seed, epoch=self.epoch, position=position, batches=batches, dataset_size=self.dataset_size,
            shuffle=self.shuffle, drop_last=self.drop_last, batch_size=self.batch_size, world_size=self.num_replicas,
            draws=self.draws.describe(), cycle=self.cycle, drop_last_batch=self.drop_last_batch,
            anchor_position=anchor[0], anchor_batches=anchor[1], stream_length=stream_length,
        )  # fmt: skip

    def state_at_start(self, epoch: int, cycle: int) -> DataState:
        """The state at the start of ``epoch``'s ``cycle``, nothing consumed."""
        length = self.epoch_length(epoch, self.seed if cycle == 0 else cycle_seed(self.seed, cycle))
        return self.data_state().at_start(epoch, cycle, length)

    def state_dict(self, batches: int | None = None) -> dict[str, Any]:
        """`data_state` in plain types: ``seed``, ``epoch``, ``position`` (all ranks), ``batches`` and the setup."""
        return self.data_state(self.declared_batches() if batches is None else batches).to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Start the saved epoch at the saved global position on the next ``iter()`` (that one only).

        A state at or past the epoch's last sample restores as a complete epoch: the next ``iter()`` yields its
        empty rest (as torchdata's ``StatefulDistributedSampler``), the one after it, or ``set_epoch`` of the next
        epoch, starts anew; into a sampler already set to that next epoch, only the seed.

        Raises ``StateFormatError`` (malformed) or ``IncompatibleStateError`` (another setup).
        """
        self.restore(DataState.from_dict(state))

    def restore(self, saved: DataState, batch_size_may_change: bool = False) -> None:
        """`load_state_dict` of a parsed state (an `IncompatibleStateError` if its setup differs, its batch size
        too unless ``batch_size_may_change``: then read on from its global position, as on another world size)."""
        saved.check_same_data(self._state(0, 0, (None, None), None), batch_size_may_change)  # a length may cost a pass
        epoch_set = self.epoch
        self.seed = saved.seed
        self.epoch, self.cycle, self._pass_complete, self._handed_out = saved.epoch, saved.cycle, False, HandedOut()
        self._origin_position, self._origin_batches = saved.position, saved.batches
        relaid = saved.laid_out_otherwise(self.num_replicas, self.batch_size)
        self._anchor = (saved.position, saved.batches) if relaid else (saved.anchor_position, saved.anchor_batches)
        self._origin_is_restored, self._restored_pass = True, None
        if self._next_epoch_starts(epoch_set):
            self.set_epoch(epoch_set)  # the loop has begun the next epoch: start it

    def _next_epoch_starts(self, epoch: int) -> bool:
        """Whether a loop at ``epoch`` starts it (`resume_start`); only the next one can (is the restored one over:
        a length may cost a pass)."""
        over = epoch == self.epoch + 1 and self.origin_at_end
        return resume_start(DataPlace(self.epoch, self._origin_batches, over), epoch) is Start.NEXT_EPOCH

    def _restore_into(self, number: int, state: Mapping[str, Any]) -> None:
        """torchdata's `SamplerPass.load_state_dict`: the restore is pass ``number``'s, none other's."""
        self.load_state_dict(state)
        if self._origin_is_restored:
            self._restored_pass = number

    def end_restored_epoch(self) -> None:
        """The loop ends the restored epoch here (`Start.EPOCH_CUT`, `Start.NEXT_EPOCH`): its rest is never read."""
        self._pass_complete = self._pass_complete or self._origin_is_restored
        self._origin_is_restored = False

    @property
    def origin_at_end(self) -> bool:
        """Whether no batch is left after the origin (a loader's ``drop_last`` drops a short one)."""
        left = self._samples_per_rank()
        return left == 0 or (self.drop_last_batch and left < self.batch_size)

    @property
    def origin(self) -> tuple[int, int, int]:
        """``(epoch, position, batches)`` where the current epoch's stream starts on this process."""
        return self.epoch, self._origin_position, self._origin_batches
