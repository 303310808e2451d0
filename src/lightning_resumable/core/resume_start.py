"""Where a resume starts: the one rule that puts the trainer's place and the data's together.

A checkpoint holds two places. Lightning's loops say where the trainer resumes: an epoch, and how many of
its batches it counts as done (its restart stage, from the progress it wrote). The data state says where
the stream stopped: an epoch, the batches read in it, and whether any batch of it is left. Every resume,
of every kind of train input (a map-style loader, several, a mixture, a stream; the sampler itself for a
loop that sets its epoch first), asks `resume_start` what the two together mean. By Lightning's restart:

- inside an epoch (a save after batch k or inside it, or in a validation inside the epoch): the trainer
  resumes epoch e after k, the data is at e after k: `Start.AT_POSITION`, read on from k;
- at an epoch's last batch, with a validation or the epoch's end still to run: the trainer resumes e with
  all its batches, the data has none left: `Start.EPOCH_ENDS`, nothing more is read of e;
- an epoch that ended (its ``on_train_epoch_end`` ran, or its last batch's end with nothing due), or a
  finished fit extended (``max_epochs`` raised, a save after ``fit()`` returned): the trainer resumes e + 1,
  the data has none of e left: `Start.NEXT_EPOCH`;
- ``limit_train_batches`` reached, or a stream read to its loader's length (Lightning stops there; the
  stream has not said it is over): `Start.EPOCH_CUT` in e (the rest of its order is dropped), or
  `Start.NEXT_EPOCH` in e + 1;
- a ``max_steps`` fit saved at its epoch's last batch, the data written at the next epoch's start:
  Lightning first ends e (`Start.EPOCH_ENDS`);
- another world size: as above, counted in the new size's batches.

Anything else is refused with `IncompatibleStateError`: the trainer resumes another epoch than the data, or
another batch of it. Where the trainer's count is not known yet (a restore before Lightning restored its
loops), nothing is refused, and only a `Start.NEXT_EPOCH` is acted on before the train start.
docs/how-it-works.md has the same as a table.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from lightning_resumable.errors import IncompatibleStateError

__all__ = ["DataPlace", "Start", "resume_start"]


class Start(enum.Enum):
    """What a resume does with the data, given where the trainer resumes."""

    AT_POSITION = "at_position"
    """The saved epoch goes on from the saved position."""
    EPOCH_ENDS = "epoch_ends"
    """Lightning first ends the saved epoch, of which the data has nothing left: the next pass is the next epoch."""
    EPOCH_CUT = "epoch_cut"
    """Lightning ends the saved epoch at its length (``limit_train_batches``, a stream's ``len()``), whatever the
    data's own order has left: the rest is dropped, and the next pass is the next epoch."""
    NEXT_EPOCH = "next_epoch"
    """The saved epoch is over and the trainer is in the next one: it starts from its beginning."""


@dataclass(frozen=True)
class DataPlace:
    """Where the data state stopped: ``epoch``, ``batches`` read in it, and whether it is ``over``: ``True``, none
    of it is left by its own order (a sampler at its end, a stream that said so); ``None``, the data cannot tell
    and Lightning's end of the epoch ends it (several loaders, each wherever it is)."""

    epoch: int
    batches: int
    over: bool | None = False


def resume_start(
    data: DataPlace,
    trainer_epoch: int,
    trainer_batches: int | None = None,
    epoch_length: float | None = None,
    where: str = "",
) -> Start:
    """Where the resume starts (the module's list), for the data at ``data`` and the trainer at its epoch and
    count of the epoch's batches (``None``: not known yet; then nothing is refused); ``epoch_length``: the
    batches Lightning reads of an epoch (``limit_train_batches`` counted; infinite, ``None`` or 0: unknown). The
    count of an epoch the data has ended is not checked: nothing more is read of it.

    Raises:
        IncompatibleStateError: the trainer resumes another epoch than the data, or another batch of it;
            ``where`` names the loader in the message.
    """
    length = epoch_length if epoch_length and epoch_length != float("inf") else None
    cut = data.over is not None and length is not None and length <= data.batches
    ended = data.over is True or cut
    if trainer_epoch == data.epoch + 1 and (ended or data.over is None):
        return Start.NEXT_EPOCH
    at_end = Start.EPOCH_CUT if cut else Start.EPOCH_ENDS
    if trainer_batches is None:
        return at_end if ended and trainer_epoch == data.epoch else Start.AT_POSITION
    if length is not None and (data.epoch, data.batches) == (trainer_epoch + 1, 0) and trainer_batches >= length:
        return Start.EPOCH_ENDS  # written as the next epoch's start: Lightning first ends the epoch it trained
    if data.epoch != trainer_epoch:
        raise IncompatibleStateError(
            f"the data state{where} resumes epoch {data.epoch} but the trainer resumes epoch {trainer_epoch}"
        )
    if data.batches and data.batches != trainer_batches and not ended:
        raise IncompatibleStateError(
            f"the data state{where} resumes after {data.batches} batches of epoch {data.epoch} but the trainer's"
            f" count means {trainer_batches}"
        )
    return at_end if ended else Start.AT_POSITION
