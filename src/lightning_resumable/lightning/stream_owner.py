"""The owner of a stream's position: an ``IterableDataset`` with state read through a `StreamReader` (a
data library's loader, or torchdata's), per-rank positions gathered at a save and handed back to
each rank at a restore; see `lightning_resumable.lightning.owners` for what every owner promises.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info

from lightning_resumable.core.global_batch import check_first_global_batch
from lightning_resumable.core.resume_start import DataPlace, Start, resume_start
from lightning_resumable.core.verification import all_gather_objects, check_first_stream_batches, digest_of
from lightning_resumable.errors import IncompatibleStateError, ResumeVerificationError, SkipError
from lightning_resumable.format.envelope import GLOBAL_POSITION_ATTRIBUTE, StreamState, Unresumable
from lightning_resumable.format.skips import Hole, Skip, StepRange
from lightning_resumable.internals._torchdata import torchdata_version
from lightning_resumable.lightning.owners import Owner
from lightning_resumable.lightning.progress import SavePoint
from lightning_resumable.lightning.world_size import WorldSizePolicy
from lightning_resumable.readers.base import StreamReader
from lightning_resumable.readers.contract import check_contract

__all__ = ["StreamOwner"]

STREAM_OFF_PATH = (
    "it was written from an exception path (OnExceptionCheckpoint after an error), where the ranks cannot"
    " exchange their stream positions without risking a deadlock, and a stream's position is per rank (a"
    " preemption by SIGTERM or SLURM's requeue signal is captured by every rank together and resumes). Resume"
    " from a checkpoint written during training (ModelCheckpoint)"
)

UNSEEDED = (
    "The callback has seed_samples=False: a stream whose samples draw from torch's, Python's or NumPy's global"
    " generator reads other values after a resume, which this check cannot tell from other samples. Draw them from"
    " lightning_resumable.sample_rng() (the same after a resume), or pass ResumableDataCallback(seed_samples=True)"
)


class StreamOwner(Owner[StreamState]):
    """A stream: an ``IterableDataset`` with state, read through a `StreamLoader` (or a data library's
    loader); per-rank positions."""

    state_type = StreamState

    def __init__(self, loader: StreamReader, rank: int, world_size: int, seeded: bool = True) -> None:
        check_contract(loader, owned=(loader.dataset,))
        self.loader, self.rank, self.world_size = loader, rank, world_size
        self.seeded = seeded  # each sample read under its own seed (the callback's seed_samples)
        self.resumes_at: DataPlace | None = None  # where the restored stream stopped
        self.verifying: tuple[int, int] | None = None  # (epoch, batches) whose next batch is verified
        self.verifying_samples: list[list[str]] | None = None  # the saving ranks' next samples, on another layout
        self.holes: list[Hole] = []  # the skipped steps' discards (see "skipped steps" below)
        self._trainer: Any = None
        self._due: dict[int, list[Hole]] = {}  # the holes whose batches the current pass discards, by batch index
        self._placed: dict[int, tuple[Hole, ...]] = {}  # a skip's holes once discarded, by its step

    def restore(self, saved: StreamState, epoch: int, verify: bool, world_size_policy: WorldSizePolicy) -> None:
        if saved.reader != self.loader.reader:
            raise IncompatibleStateError(
                f"the checkpoint's stream was read by {saved.reader}'s loader, and the train loader is now"
                f" {self.loader.reader}'s"
            )
        where = f"at epoch {saved.epoch}, after {saved.batches} batches of its stream"
        world_size_policy(saved.world_size, self.world_size, self.loader.world_size_refusal(saved), where)
        self._refuse_another_batch_size(saved)
        state = self.loader.state_for_rank(saved, self.rank, self.world_size)  # the reader's checks of its layout
        self.resumes_at = place = DataPlace(saved.epoch, saved.batches, saved.finished)
        # Nothing more is read of a saved epoch that is over (a trainer in the next one would start it): the next
        # pass is the next epoch, wherever the trainer is (the train start refuses another place).
        if resume_start(place, saved.epoch + 1, epoch_length=_length(self.loader)) is Start.NEXT_EPOCH:
            self.loader.start_epoch(saved.epoch + 1)
            # Over by the length it had (another batch size counts the next epoch in other units): said once.
            self.resumes_at = replace(place, over=True)
        elif saved.epoch == epoch:
            # Each rank verifies its own next batch, on the world size that recorded them.
            if verify and saved.next_batch is None:
                rank_zero_info("lightning_resumable: the checkpoint holds no batch digest; the resume is not verified")
            batch_size = getattr(self.loader, "batch_size", None)
            # Each rank's next batch is the one it recorded only on the layout that recorded it (another batch size
            # of a global position, Mosaic's, regroups the same global sequence).
            layout_kept = (
                saved.world_size == self.world_size
                and saved.batch_size in (None, batch_size)
                and (not self._resumes_anywhere or saved.num_workers == self.loader.num_workers)
            )
            verifiable = verify and layout_kept
            recorded = saved.next_batch if verifiable else None
            self.loader.resume_from(state, saved.batches, recorded[self.rank] if recorded else "")
            self.verifying = (saved.epoch, saved.batches) if recorded else None
            # On another layout only the global batch is the checkpoint's: checked sample by sample.
            samples = saved.next_samples if verify and not verifiable else None
            if verify and not verifiable and not self.loader.continues_elsewhere(state):
                rank_zero_info(
                    "lightning_resumable: nothing of the checkpoint's epoch was read, and on this layout it is this"
                    " layout's own: there is no batch of the checkpoint's to verify"
                )
            elif samples is not None and isinstance(batch_size, int):
                self.loader.record.digest_first_samples(batch_size)
                self.verifying, self.verifying_samples = (saved.epoch, saved.batches), samples
            elif verify and not verifiable:
                rank_zero_info(
                    "lightning_resumable: the stream resumes on another layout and its checkpoint holds no"
                    " digests of its next samples; the resume is not verified"
                )
        else:
            raise IncompatibleStateError(
                f"the stream state resumes epoch {saved.epoch} after {saved.batches} batches, but the trainer"
                f" resumes epoch {epoch}"
            )

    @property
    def _resumes_anywhere(self) -> bool:
        """Whether the loader resumes its epoch on another layout in the order that began it (LitData's)."""
        return bool(getattr(self.loader, "resumes_on_any_layout", False))

    def rebuild_at_epoch_end(self, epoch: int) -> bool:
        return bool(getattr(self.loader, "resumed_elsewhere", False))  # counted on this layout from the next epoch

    def recount_at_epoch_end(self, epoch: int) -> bool:
        if not getattr(self.loader, "counted_anew_at_epoch_end", False):
            return False
        self.loader.count_anew()  # type: ignore[attr-defined]  # Mosaic's: its own length from the next epoch
        self.recounting = True
        return True

    def _refuse_another_batch_size(self, saved: StreamState) -> None:
        """A stream's position per rank is its readers' (each loader worker yields whole batches of its own samples):
        another batch size regroups them, and the order after the resume would not be the uninterrupted run's. (A
        position of all ranks together is its reader's to check: Mosaic's counts global batches.)"""
        batch_size = getattr(self.loader, "batch_size", None)
        if saved.batch_size is None or batch_size is None or saved.global_position or self._resumes_anywhere:
            return  # not recorded (a state before version 4), or a loader whose batch size is its dataset's
        if saved.batch_size != batch_size:
            raise IncompatibleStateError(
                f"the checkpoint's stream was read in batches of {saved.batch_size} samples per process, and the"
                f" train loader now reads batches of {batch_size}: each loader worker yields whole batches of its own"
                " samples, so another batch size would regroup them and the order after the resume would not be the"
                f" uninterrupted run's. Resume with batch_size={saved.batch_size}"
            )

    def start_fresh(self, epoch: int) -> None:
        pass  # the loader asks the trainer for its epoch at each iter()

    def save(self, at: SavePoint) -> StreamState | Unresumable:
        if not at.collective and at.world_size > 1:  # one process waits for no other
            return Unresumable(STREAM_OFF_PATH)
        check_contract(self.loader, owned=(self.loader.dataset,))
        loader, batches = self.loader, at.batches
        digest = loader.next_batch_digest(batches) if at.verify else ""
        global_position = any(getattr(each, GLOBAL_POSITION_ATTRIBUTE, False) for each in (loader, loader.dataset))
        batch_size = getattr(loader, "batch_size", None)
        # A global position may resume on another world size, where only the global batch can be checked.
        elastic = at.verify and (global_position or self._resumes_anywhere) and isinstance(batch_size, int)
        samples = loader.record.next_sample_digests(batches, batch_size) if elastic and batch_size else []
        gathered = all_gather_objects((loader.state_after(batches), digest, loader.finished_after(batches), samples))
        ranks = [state for state, _, _, _ in gathered]
        return StreamState(
            seed=at.seed,
            epoch=at.epoch,
            batches=at.batches,
            world_size=at.world_size,
            num_workers=self.loader.num_workers,
            global_position=global_position,
            finished=all(finished for _, _, finished, _ in gathered),
            ranks=ranks,
            torchdata=torchdata_version(),
            next_batch=[digest for _, digest, _, _ in gathered] if at.verify else None,
            reader=loader.reader,
            batch_size=batch_size,
            next_samples=[samples for _, _, _, samples in gathered] if elastic else None,
        )

    def ran_to_end(self, saved: StreamState, at: SavePoint) -> bool:
        return saved.finished  # a stream's length is its own: every rank read to its end

    def start(self, trainer: pl.Trainer, batches: int) -> int:
        if self.resumes_at is None:
            return 0
        place, self.resumes_at = self.resumes_at, None
        # A stream read to its end resumes in the next epoch, or at the end of its own where Lightning's loop
        # ends that epoch first (a checkpoint of the validation after its last batch): nothing is read there.
        start = resume_start(place, trainer.current_epoch, batches, _length(self.loader), " (the stream)")
        return place.batches if start is Start.AT_POSITION else 0

    def check_first_batch(self) -> None:
        try:
            self._check_first_batch()
        except ResumeVerificationError as error:
            if self.seeded:
                raise
            raise ResumeVerificationError(f"{error}. {UNSEEDED}") from None

    def _check_first_batch(self) -> None:
        if self.verifying is None:
            return
        (epoch, batches), self.verifying = self.verifying, None
        recorded, self.verifying_samples = self.verifying_samples, None
        if recorded is None:
            check_first_stream_batches(all_gather_objects(self.loader.first_batch), epoch, batches)
            return
        read = all_gather_objects(self.loader.record.first_samples)
        length = _length(self.loader)
        # An epoch's last global batch holds samples repeated to share it among the ranks, which depend on the layout.
        last = length is not None and batches + 1 >= length
        unchecked = check_first_global_batch(
            recorded, read, epoch, batches, in_order=self._resumes_anywhere, epoch_end=last
        )
        if unchecked:
            rank_zero_info(f"lightning_resumable: the first global batch after the resume is not verified: {unchecked}")

    def trained_ids(self, batch: Any, batch_idx: int) -> str:
        return digest_of(batch)  # a stream's samples have no index

    def retire_workers(self) -> None:
        self.recounting = False  # the fit is over (or the loader is built again): nothing recounts it
        self.loader.retire_workers()

    # ------------------------------------------------------------------------------ skipped steps
    # A stream's order is its readers' state: its skipped data is read and discarded (Megatron's way). A skip
    # planned is a hole ``(None, step, batches)``: this rank's batches to discard as that step begins; once
    # discarded it is ``(epoch, batch, batches)``, where it was, and what the epoch's end cut off goes on as
    # ``(epoch + 1, 0, batches)``, discarded as the next epoch begins.
    def set_holes(self, holes: tuple[Hole, ...]) -> None:
        if not self.loader.record.holds_state:
            raise SkipError(f"skipped steps are not supported for {self.loader.library}'s loader")
        self.holes = list(holes)
        self.loader.record.discards, self.loader.record.discarded = self._discards, self._discarded

    def watch_steps(self, trainer: pl.Trainer) -> None:
        self._trainer = trainer

    def plan_skips(
        self, ranges: Sequence[StepRange], step: int, accumulate: int, limit: int | float | None
    ) -> list[Skip]:
        made: list[Skip] = []
        for each in ranges:
            at = each.first - sum(skip.steps.steps for skip in made)
            made.append(Skip(each, at, (Hole(None, at, each.steps * accumulate),)))
        return made

    def skip_verification(self) -> None:
        self.verifying = None
        self.loader.record.expect_first("")

    def _discards(self, first: int, resumed: bool) -> dict[int, int]:
        """This rank's batches to discard before each batch index of a pass starting at batch ``first``."""
        if self._trainer is None:
            return {}
        step, accumulate, epoch = (
            self._trainer.global_step,
            self._trainer.accumulate_grad_batches,
            self.loader.record.epoch,
        )
        self._due = {}
        for hole in self.holes:
            if hole.epoch is None and hole.start >= step:  # not discarded yet
                index = first + (hole.start - step) * accumulate
            elif hole.epoch == epoch and (hole.start > first or (hole.start == first and not resumed)):
                index = hole.start
            else:
                continue
            self._due.setdefault(index, []).append(hole)
        return {index: sum(hole.length for hole in holes) for index, holes in self._due.items()}

    def _discarded(self, epoch: int, index: int, read: int, left: int) -> None:
        """The pass read and discarded ``read`` batches before batch ``index``; ``left`` were cut off by its end."""
        done = self._due.pop(index, [])
        self.holes = [hole for hole in self.holes if hole not in done]
        for hole in done:  # in the order they were due: a carried discard first
            taken = min(hole.length, read)
            read -= taken
            pieces: tuple[Hole, ...] = (Hole(epoch, index, taken),)
            if hole.length > taken:
                pieces += (Hole(epoch + 1, 0, hole.length - taken),)
            self.holes += pieces
            if hole.epoch is None:  # a skip's discard began: its record says where
                self._placed[hole.start] = pieces

    def recorded_skips(self, skips: tuple[Skip, ...]) -> tuple[Skip, ...]:
        return tuple(replace(skip, holes=self._placed.get(skip.at, skip.holes)) for skip in skips)


def _length(loader: Any) -> int | None:
    """The batches Lightning reads of the stream's epoch: its loader's length (it reads no batch past ``len()``,
    though the stream has not said it is over); ``None``: no length, the stream's own end ends the epoch."""
    try:
        return len(loader)
    except TypeError:
        return None
