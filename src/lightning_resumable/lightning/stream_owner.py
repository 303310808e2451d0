"""The owner of a stream's position: an ``IterableDataset`` with state read through a `StreamReader` (a
data library's loader, or torchdata's), per-rank positions gathered at a save and handed back to
each rank at a restore; see `lightning_resumable.lightning.owners` for what every owner promises.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info

from lightning_resumable.core.resume_start import DataPlace, Start, resume_start
from lightning_resumable.core.verification import all_gather_objects, check_first_stream_batches, digest_of
from lightning_resumable.errors import IncompatibleStateError
from lightning_resumable.format.envelope import GLOBAL_POSITION_ATTRIBUTE, StreamState, Unresumable
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


class StreamOwner(Owner[StreamState]):
    """A stream: an ``IterableDataset`` with state, read through a `StreamLoader` (or a data library's
    loader); per-rank positions."""

    state_type = StreamState

    def __init__(self, loader: StreamReader, rank: int, world_size: int) -> None:
        check_contract(loader, owned=(loader.dataset,))
        self.loader, self.rank, self.world_size = loader, rank, world_size
        self.resumes_at: DataPlace | None = None  # where the restored stream stopped
        self.verifying: tuple[int, int] | None = None  # (epoch, batches) whose next batch is verified

    def restore(self, saved: StreamState, epoch: int, verify: bool, world_size_policy: WorldSizePolicy) -> None:
        if saved.reader != self.loader.reader:
            raise IncompatibleStateError(
                f"the checkpoint's stream was read by {saved.reader}'s loader, and the train loader is now"
                f" {self.loader.reader}'s"
            )
        where = f"at epoch {saved.epoch}, after {saved.batches} batches of its stream"
        world_size_policy(saved.world_size, self.world_size, self.loader.world_size_refusal(saved), where)
        state = self.loader.state_for_rank(saved, self.rank, self.world_size)  # the reader's checks of its layout
        self.resumes_at = place = DataPlace(saved.epoch, saved.batches, saved.finished)
        # Nothing more is read of a saved epoch that is over (a trainer in the next one would start it): the next
        # pass is the next epoch, wherever the trainer is (the train start refuses another place).
        if resume_start(place, saved.epoch + 1, epoch_length=_length(self.loader)) is Start.NEXT_EPOCH:
            self.loader.start_epoch(saved.epoch + 1)
        elif saved.epoch == epoch:
            # Each rank verifies its own next batch, on the world size that recorded them.
            if verify and saved.next_batch is None:
                rank_zero_info("lightning_resumable: the checkpoint holds no batch digest; the resume is not verified")
            verifiable = verify and saved.world_size == self.world_size
            recorded = saved.next_batch if verifiable else None
            self.loader.resume_from(state, saved.batches, recorded[self.rank] if recorded else "")
            self.verifying = (saved.epoch, saved.batches) if recorded else None
        else:
            raise IncompatibleStateError(
                f"the stream state resumes epoch {saved.epoch} after {saved.batches} batches, but the trainer"
                f" resumes epoch {epoch}"
            )

    def start_fresh(self, epoch: int) -> None:
        pass  # the loader asks the trainer for its epoch at each iter()

    def save(self, at: SavePoint) -> StreamState | Unresumable:
        if not at.collective and at.world_size > 1:  # one process waits for no other
            return Unresumable(STREAM_OFF_PATH)
        check_contract(self.loader, owned=(self.loader.dataset,))
        loader, batches = self.loader, at.batches
        digest = loader.next_batch_digest(batches) if at.verify else ""
        gathered = all_gather_objects((loader.state_after(batches), digest, loader.finished_after(batches)))
        ranks = [state for state, _, _ in gathered]
        return StreamState(
            seed=at.seed,
            epoch=at.epoch,
            batches=at.batches,
            world_size=at.world_size,
            num_workers=self.loader.num_workers,
            global_position=any(getattr(each, GLOBAL_POSITION_ATTRIBUTE, False) for each in (loader, loader.dataset)),
            finished=all(finished for _, _, finished in gathered),
            ranks=ranks,
            torchdata=torchdata_version(),
            next_batch=[digest for _, digest, _ in gathered] if at.verify else None,
            reader=loader.reader,
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
        if self.verifying is not None:
            (epoch, batches), self.verifying = self.verifying, None
            check_first_stream_batches(all_gather_objects(self.loader.first_batch), epoch, batches)

    def trained_ids(self, batch: Any, batch_idx: int) -> str:
        return digest_of(batch)  # a stream's samples have no index

    def retire_workers(self) -> None:
        self.loader.retire_workers()


def _length(loader: Any) -> int | None:
    """The batches Lightning reads of the stream's epoch: its loader's length (it reads no batch past ``len()``,
    though the stream has not said it is over); ``None``: no length, the stream's own end ends the epoch."""
    try:
        return len(loader)
    except TypeError:
        return None
