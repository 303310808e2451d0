"""The owners of the train input, one per kind: one map-style loader, several loaders (a stream's is in
`lightning_resumable.lightning.stream_owner`, a mixture's in `lightning_resumable.lightning.mixture_owner`).

Promise: an owner is the one holder of its loaders' position from the moment they are attached to
the end of the fit. It restores a saved state before the loaders are iterated, records the state at
a save, checks at the train start that the trainer resumes where the data does (and verifies the
next batches), names the ids of each trained step, and says when the loader must be rebuilt at an
epoch's end. The owner is picked once, where the loaders are built (`lightning_resumable.lightning.train_input`),
and the callback delegates to it (as Grain's elastic iterator picks its base iterator once and
delegates its state), so no kind is told apart anywhere else. Each owner is typed by the state it
saves; the world-size policy is the callback's one function, which every owner calls.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Generic, TypeVar

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from lightning_resumable.core.resume_start import DataPlace, Start, resume_start
from lightning_resumable.core.sampler import ResumableSampler
from lightning_resumable.core.skips import plan
from lightning_resumable.core.step_layout import sampler_layout
from lightning_resumable.errors import IncompatibleStateError, SkipError
from lightning_resumable.format.envelope import (
    Body,
    Envelope,
    LoadersState,
    LoaderState,
    MixtureState,
    PartialAccumulation,
    StreamState,
    Unresumable,
)
from lightning_resumable.format.skips import Hole, Skip, StepRange, holes_of
from lightning_resumable.format.state import DataState
from lightning_resumable.lightning.combined import loader_position, refuse_other_batch_sizes
from lightning_resumable.lightning.progress import SavePoint
from lightning_resumable.lightning.sampled_loader import SampledLoader
from lightning_resumable.lightning.world_size import WorldSizePolicy
from lightning_resumable.readers.workers import retire_previous

__all__ = ["LoaderOwner", "LoadersOwner", "Owner"]

SEVERAL_SAME_SIZE = "several train loaders resume on the same world size only"


S = TypeVar("S", LoaderState, LoadersState, StreamState, MixtureState)


class Owner(ABC, Generic[S]):
    """One kind of train input, typed by the state it saves and restores; see the module's promise."""

    state_type: type[S]
    rebuild_now = False
    """Set by `start`: the loaders' iterators made before it read the wrong epoch ahead; build them again."""

    def restore_saved(self, saved: Body, epoch: int, verify: bool, world_size_policy: WorldSizePolicy) -> None:
        """`restore` a checkpoint's state, refused if it is another kind's."""
        if not isinstance(saved, self.state_type):
            raise IncompatibleStateError(
                f"the checkpoint holds the state of {saved.described}, but train_dataloader() now returns"
                f" {self.state_type.described}"
            )
        self.restore(saved, epoch, verify, world_size_policy)

    @abstractmethod
    def restore(self, saved: S, epoch: int, verify: bool, world_size_policy: WorldSizePolicy) -> None:
        """Apply ``saved`` before the loaders are iterated (``epoch``: the trainer's current one)."""

    @abstractmethod
    def start_fresh(self, epoch: int) -> None:
        """No state to restore: select ``epoch`` before the loaders are iterated."""

    def carried(self, epoch: int) -> S | None:
        """What a loader built again at ``epoch`` within the run restores (``None``: a fresh start is the same)."""
        return None

    @abstractmethod
    def save(self, at: SavePoint) -> S | Unresumable:
        """The state at ``at``; or, where none can be written, why (the checkpoint is marked)."""

    def envelope(self, at: SavePoint, partial: Callable[[bool], PartialAccumulation | None]) -> Envelope:
        """The state at ``at`` in its envelope, marked by ``partial`` (of whether it ran to its epoch's end)."""
        saved = self.save(at)
        if isinstance(saved, Unresumable):
            return Envelope(None, reason=saved.reason)
        return Envelope(saved, partial_accumulation=partial(self.ran_to_end(saved, at)))

    def ran_to_end(self, saved: S, at: SavePoint) -> bool:
        """Whether ``saved`` is at the end of its epoch (a save there is never inside an accumulation window)."""
        return at.complete

    @property
    def first_sampler(self) -> ResumableSampler | None:
        """The sampler of the (first) map-style loader; ``None`` for a stream."""
        return None

    @abstractmethod
    def start(self, trainer: pl.Trainer, batches: int) -> int:
        """At the train start: refuse a trainer resuming elsewhere than the data (``batches``: its count),
        verify the next batches; the index of the first batch this process trains."""

    def check_first_batch(self) -> None:
        """Before the first batch a process trains after a restore: compare it, as the loader produced
        it, with the checkpoint's record; collective."""
        return None

    @abstractmethod
    def trained_ids(self, batch: Any, batch_idx: int) -> Any:
        """What the audit log records of a trained step."""

    def batch_started(self, batch: int) -> None:
        """The trainer begins batch ``batch`` of the current epoch (the library's count)."""
        return None

    def weights_of(self, batch: int) -> dict[str, str] | None:
        """The weights batch ``batch`` of the current epoch was drawn under (a mixture's), for the audit log."""
        return None

    def rebuild_at_epoch_end(self, epoch: int) -> bool:
        """Whether the train loader must be built again before the next epoch (its length changes)."""
        return False

    recounting = False
    """Lightning is about to count the batches of the same train input again (`recount_at_epoch_end`)."""

    def recount_at_epoch_end(self, epoch: int) -> bool:
        """Whether Lightning must count the train loader's batches again before the next epoch, the loader kept (its
        length changes, and a data library's dataset is not built twice in one process): sets `recounting`."""
        return False

    @abstractmethod
    def retire_workers(self) -> None:
        """At the end of the fit: end the loaders' workers (none may outlive the fit)."""

    # ---------------------------------------------------------------------- skipped steps
    def set_holes(self, holes: tuple[Hole, ...]) -> None:
        """Read the stream around ``holes`` (`lightning_resumable.core.skips`), before the loaders are iterated."""
        raise SkipError(
            "skipped steps are supported for one train loader (map-style, with any sampler or a batch sampler, or"
            " a stream: a user's, Hugging Face, WebDataset, LitData's) or a Mixture, not for MosaicML Streaming's"
            f" loader or several loaders; the train input is {self.state_type.described}"
        )

    def plan_skips(
        self, ranges: Sequence[StepRange], step: int, accumulate: int, limit: int | float | None
    ) -> list[Skip]:
        """The skips of ``ranges``, from ``step`` (the next to train), as `lightning_resumable.core.skips.plan`s."""
        raise SkipError(f"skipped steps are not supported for {self.state_type.described}")

    def watch_steps(self, trainer: pl.Trainer) -> None:
        """Where a skip is found by the trainer's step as a pass begins (a stream's), the trainer to read it from."""
        return None

    def reached_at(
        self, skips: tuple[Skip, ...], step: int, accumulate: int, limit: int | float | None
    ) -> tuple[Skip, ...]:
        """``skips`` (restored), those still ahead of ``step`` reached where this run's steps read them (another
        world size than the one that planned them reaches them at other steps)."""
        return skips

    def recorded_skips(self, skips: tuple[Skip, ...]) -> tuple[Skip, ...]:
        """``skips`` as a save records them (a stream's discard cut by an epoch's end goes on in the next)."""
        return skips

    def skip_verification(self) -> None:
        """The next batch follows a skip made now: it is not the one the checkpoint fingerprinted."""
        return None


def _where(state: DataState) -> str:
    return f"at epoch {state.epoch}, global position {state.position}"


class LoaderOwner(Owner[LoaderState]):
    """One map-style train loader, which resumes on another world size and with another batch size."""

    state_type = LoaderState

    def __init__(self, loader: DataLoader[Any]) -> None:
        self.owned = SampledLoader(loader, key=None)
        self.resized_epoch: int | None = None
        self.resized_from: DataState | None = None  # the restored state, where another world size wrote it

    @property
    def sampler(self) -> ResumableSampler:
        return self.owned.sampler

    first_sampler = sampler

    def restore(self, saved: LoaderState, epoch: int, verify: bool, world_size_policy: WorldSizePolicy) -> None:
        world_size, batch_size = self.sampler.num_replicas, self.sampler.batch_size
        world_size_policy(saved.state.world_size, world_size, None, _where(saved.state))
        self.owned.restore(saved, verify, epoch, batch_size_may_change=True)  # refuses another setup first
        if saved.state.batch_size != batch_size:
            rank_zero_info(
                f"lightning_resumable: the checkpoint was written with batches of {saved.state.batch_size} samples"
                f" per process and resumes with {batch_size}, {_where(saved.state)}; the epoch goes on from its"
                " global position in batches of the new size"
            )
        resized = saved.state.laid_out_otherwise(world_size, batch_size)
        if resized:
            self.resized_epoch = saved.state.epoch  # counted in the old units: rebuilt at its end
        self.resized_from = saved.state if resized else None

    def start_fresh(self, epoch: int) -> None:
        self.resized_from = None
        self.sampler.set_epoch(epoch)

    def save(self, at: SavePoint) -> LoaderState:
        return self.owned.save(at.batches, None, at)

    def start(self, trainer: pl.Trainer, batches: int) -> int:
        start = self.owned.check_start(trainer, (0, batches))
        self.rebuild_now = start is Start.NEXT_EPOCH
        if start is Start.EPOCH_CUT:  # limit_train_batches reached: Lightning ends the epoch and reads no more
            self.sampler.end_restored_epoch()
        return self.owned.first_batch()

    def check_first_batch(self) -> None:
        self.owned.check_produced()

    def trained_ids(self, batch: Any, batch_idx: int) -> list[int]:
        return self.sampler.batch_indices(batch_idx)

    def retire_workers(self) -> None:
        retire_previous(self.owned.loader)

    def set_holes(self, holes: tuple[Hole, ...]) -> None:
        self.sampler.holes = holes

    def plan_skips(
        self, ranges: Sequence[StepRange], step: int, accumulate: int, limit: int | float | None
    ) -> list[Skip]:
        # Steps are numbered as the run that wrote the checkpoint numbered them, on its world size; a run on
        # another world size reaches each skip at a step of its own, where its batches read the first hole.
        made = plan(ranges, sampler_layout(self.sampler, step, accumulate, limit, self.resized_from))
        if self.resized_from is None or not made:
            return made
        recorded = self.sampler.holes
        self.sampler.holes = (*recorded, *holes_of(made))  # the new run's epochs, shortened by every hole
        try:
            return list(self.reached_at(tuple(made), step, accumulate, limit))  # each lies at or after ``step``
        finally:
            self.sampler.holes = recorded

    def reached_at(
        self, skips: tuple[Skip, ...], step: int, accumulate: int, limit: int | float | None
    ) -> tuple[Skip, ...]:
        if self.resized_from is None or not any(skip.at >= step and skip.holes for skip in skips):
            return skips
        here = sampler_layout(self.sampler, step, accumulate, limit)
        return tuple(
            replace(skip, at=here.step_reading(skip.holes[0])) if skip.at >= step and skip.holes else skip
            for skip in skips
        )

    def skip_verification(self) -> None:
        self.owned.to_verify = None
        self.owned.verifying_produced = False

    def rebuild_at_epoch_end(self, epoch: int) -> bool:
        if self.resized_epoch == epoch:
            # The epoch resumed on a new world size is over; count the next ones on the new size.
            self.resized_epoch = None
            return True
        # A batch sampler's epochs may hold different numbers of batches: Lightning counts them once per build.
        return self.owned.next_epoch_differs_in_length(epoch)


class LoadersOwner(Owner[LoadersState]):
    """Several map-style train loaders by key, iterated by a ``CombinedLoader`` in ``mode``."""

    state_type = LoadersState

    def __init__(self, loaders: Mapping[str, DataLoader[Any]], mode: str, seed: int) -> None:
        self.owned = {key: SampledLoader(loader, key) for key, loader in loaders.items()}
        self.mode, self.seed = mode, seed
        for owned in self.owned.values():  # max_size_cycle restarts a shorter loader: a fresh order each time
            owned.sampler.passes = "cycle" if mode == "max_size_cycle" else "once"

    def restore(self, saved: LoadersState, epoch: int, verify: bool, world_size_policy: WorldSizePolicy) -> None:
        if saved.mode != self.mode or set(saved.loaders) != set(self.owned):
            raise IncompatibleStateError(
                f"the checkpoint holds train loaders {sorted(saved.loaders)} in {saved.mode} mode; now they are"
                f" {sorted(self.owned)} in {self.mode} mode"
            )
        sizes = {key: saved.loaders[key].state.batch_size for key in self.owned}
        refuse_other_batch_sizes(self.mode, sizes, {key: each.sampler.batch_size for key, each in self.owned.items()})
        for key in sorted(self.owned):
            state = saved.loaders[key].state
            world_size_policy(state.world_size, self.owned[key].sampler.num_replicas, SEVERAL_SAME_SIZE, _where(state))
            self.owned[key].restore(saved.loaders[key], verify, epoch, lightning_ends_epoch=True)

    @property
    def first_sampler(self) -> ResumableSampler:
        return next(iter(self.owned.values())).sampler

    def start_fresh(self, epoch: int) -> None:
        for each in self.owned.values():
            each.sampler.set_epoch(epoch)

    def save(self, at: SavePoint) -> LoadersState:
        saved = {}
        for key in sorted(self.owned):  # the same order on every rank
            owned = self.owned[key]
            cycle, loader_batches = loader_position(self.mode, at.batches, len(owned.loader))
            saved[key] = owned.save(loader_batches, cycle, at)
        return LoadersState(self.seed, self.mode, saved)

    def start(self, trainer: pl.Trainer, batches: int) -> int:
        first = 0
        for owned in self.owned.values():
            # Where Lightning ended the saved epoch (a finished fit extended), how far each loader read in it (a
            # shorter one restarted, a longer one cut short) no longer matters: the next epoch starts.
            position = loader_position(self.mode, batches, len(owned.loader))
            started = owned.check_start(trainer, position, lightning_ends_epoch=True)
            self.rebuild_now = started is Start.NEXT_EPOCH or self.rebuild_now
            first = max(first, owned.first_batch())
        # Lightning ends the restored epoch at its last batch (limit_train_batches), counted over the loaders together
        place = DataPlace(self.first_sampler.epoch, first)
        if resume_start(place, trainer.current_epoch, epoch_length=trainer.num_training_batches) is Start.EPOCH_CUT:
            for owned in self.owned.values():
                owned.sampler.end_restored_epoch()
        return first

    def check_first_batch(self) -> None:
        for key in sorted(self.owned):  # the same order on every rank
            self.owned[key].check_produced()

    def trained_ids(self, batch: Any, batch_idx: int) -> dict[str, list[int] | None]:
        ids: dict[str, list[int] | None] = {}
        for key, owned in self.owned.items():
            length = len(owned.loader)
            _, loader_batch = loader_position(self.mode, batch_idx, length)
            ids[key] = None if loader_batch >= length else owned.sampler.batch_indices(loader_batch)
        return ids

    def rebuild_at_epoch_end(self, epoch: int) -> bool:
        return any(owned.next_epoch_differs_in_length(epoch) for owned in self.owned.values())

    def retire_workers(self) -> None:
        for owned in self.owned.values():
            retire_previous(owned.loader)
