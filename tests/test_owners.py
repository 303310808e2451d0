"""The owners' shared policies: the one world-size policy every kind of train input calls, and a stream's
resume at the end of its epoch, where Lightning's loop ends that epoch first."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import pytest
from torch.utils.data import IterableDataset

from lightning_resumable.errors import IncompatibleStateError, WorldSizeChangedError
from lightning_resumable.format.envelope import StreamState
from lightning_resumable.lightning.stream_owner import StreamOwner
from lightning_resumable.lightning.world_size import check_world_size
from lightning_resumable.readers.base import StreamReader


class Stream(IterableDataset[int]):
    def __iter__(self) -> Any:
        return iter(range(4))

    def state_dict(self) -> dict[str, int]:
        return {"at": 0}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass


class Reader(StreamReader):
    """A stream loader as a `StreamOwner` sees it (a data library's, with the base reader's resume policy),
    recording what the owner asks of it."""

    reader = "mosaic"
    library = "MosaicML Streaming"
    num_workers = 0
    first_batch = None

    def __init__(self) -> None:
        self.dataset = Stream()
        self.resumed: tuple[Mapping[str, Any], int] | None = None
        self.next_epoch: int | None = None

    def resume_from(self, state: Mapping[str, Any], batches: int, next_batch: str = "") -> None:
        self.resumed = (state, batches)

    def start_epoch(self, epoch: int) -> None:
        self.next_epoch = epoch


def stream_state(world_size: int, finished: bool = False) -> StreamState:
    ranks = [{"samples": 8} for _ in range(world_size)]
    return StreamState(1, 1, 2, world_size, 0, global_position=True, finished=finished, ranks=ranks, reader="mosaic")


class Trainer:
    def __init__(self, epoch: int) -> None:
        self.current_epoch = epoch


def test_the_world_size_policy_logs_an_elastic_resume_and_refuses_where_forbidden_or_inexact() -> None:
    check_world_size(True, 2, 2, "not elastic", "here")  # the same world size: nothing to police
    check_world_size(True, 2, 1, None, "here")
    with pytest.raises(WorldSizeChangedError, match="allow_world_size_change=False"):
        check_world_size(False, 2, 1, None, "at epoch 1")
    with pytest.raises(WorldSizeChangedError, match="epoch 1; same world size only"):
        check_world_size(True, 2, 1, "same world size only", "at epoch 1")


def test_a_global_stream_on_another_world_size_goes_through_the_policy() -> None:
    forbidding = functools.partial(check_world_size, False)
    with pytest.raises(WorldSizeChangedError, match="resumes on 1, at epoch 1, after 2 batches"):
        StreamOwner(Reader(), 0, 1).restore(stream_state(2), 1, True, forbidding)  # type: ignore[arg-type]
    reader = Reader()
    StreamOwner(reader, 0, 1).restore(stream_state(2), 1, True, functools.partial(check_world_size, True))  # type: ignore[arg-type]
    assert reader.resumed == ({"samples": 8}, 2)


@pytest.mark.parametrize("trainer_epoch", [1, 2])
def test_a_finished_stream_resumes_in_the_next_epoch_or_at_its_own_end(trainer_epoch: int) -> None:
    """Lightning resumes a checkpoint of the validation after an epoch's last batch at that epoch's end
    (epoch 1 here), one of the last batch's ``on_train_batch_end`` in the next epoch (2): the stream's
    next pass is epoch 2 either way."""
    reader = Reader()
    owner = StreamOwner(reader, 0, 2)  # type: ignore[arg-type]
    owner.restore(stream_state(2, finished=True), trainer_epoch, True, functools.partial(check_world_size, True))
    assert reader.next_epoch == 2 and reader.resumed is None
    assert owner.start(Trainer(trainer_epoch), 0) == 0  # type: ignore[arg-type]


def test_a_finished_stream_is_refused_two_epochs_on() -> None:
    owner = StreamOwner(Reader(), 0, 2)  # type: ignore[arg-type]
    owner.restore(stream_state(2, finished=True), 3, True, functools.partial(check_world_size, True))
    with pytest.raises(IncompatibleStateError, match="resumes epoch 1 but the trainer resumes epoch 3"):
        owner.start(Trainer(3), 0)  # type: ignore[arg-type]


def test_a_stream_read_by_another_reader_is_refused_naming_both() -> None:
    """The format reads any reader's tag (a new data library adds none there); the owner refuses another's."""
    saved = StreamState.from_dict({**stream_state(1).to_dict(), "reader": "webdataset"})
    with pytest.raises(
        IncompatibleStateError, match="read by webdataset's loader, and the train loader is now mosaic's"
    ):
        StreamOwner(Reader(), 0, 1).restore(saved, 1, True, functools.partial(check_world_size, True))  # type: ignore[arg-type]
