"""`resume_start`, the one rule of where a resume starts: each of Lightning's restart stages against the data state
(the module's list), and the places it refuses."""

from __future__ import annotations

import pytest

from lightning_resumable.core.resume_start import DataPlace, Start, resume_start
from lightning_resumable.errors import IncompatibleStateError

LENGTH = 8  # the batches Lightning reads of an epoch


@pytest.mark.parametrize(
    ("data", "trainer", "start"),
    [
        (DataPlace(2, 3), (2, 3), Start.AT_POSITION),  # inside an epoch
        (DataPlace(2, 0), (2, 0), Start.AT_POSITION),  # an epoch's start
        (DataPlace(2, 7, over=True), (2, 7), Start.EPOCH_ENDS),  # its last batch, a validation or its end to run
        (DataPlace(2, 8, over=True), (2, 8), Start.EPOCH_CUT),  # ...at the epoch's length too: any rest dropped
        (DataPlace(2, 8, over=True), (3, 0), Start.NEXT_EPOCH),  # an epoch that ended; a finished fit extended
        (DataPlace(2, 9), (2, 8), Start.EPOCH_CUT),  # limit_train_batches reached, the order not at its end
        (DataPlace(2, 8), (3, 0), Start.NEXT_EPOCH),  # the limit reached, the trainer in the next epoch
        (DataPlace(3, 0), (2, 8), Start.EPOCH_ENDS),  # written at the next epoch's start: Lightning first ends this
        (DataPlace(2, 5, over=None), (3, 0), Start.NEXT_EPOCH),  # several loaders: Lightning's end ends theirs
        (DataPlace(2, 5, over=None), (2, 5), Start.AT_POSITION),
        (DataPlace(2, 5, over=True), (2, 7), Start.EPOCH_ENDS),  # an ended epoch's count is not checked
    ],
)
def test_each_restart_stage_against_the_data_state(data: DataPlace, trainer: tuple[int, int], start: Start) -> None:
    assert resume_start(data, trainer[0], trainer[1], LENGTH) is start


@pytest.mark.parametrize(
    ("data", "trainer", "message"),
    [
        (DataPlace(1, 3), (2, 0), "resumes epoch 1 but the trainer resumes epoch 2"),  # not over: no next epoch
        (DataPlace(2, 3), (2, 4), "after 3 batches of epoch 2 but the trainer's count means 4"),
        (DataPlace(2, 5, over=None), (2, 6), "after 5 batches"),
        (DataPlace(4, 0), (2, 8), "resumes epoch 4 but the trainer resumes epoch 2"),
        (DataPlace(3, 0), (2, 7), "resumes epoch 3"),  # the next epoch's start, the trainer not at this one's end
    ],
)
def test_another_place_is_refused_naming_both(data: DataPlace, trainer: tuple[int, int], message: str) -> None:
    with pytest.raises(IncompatibleStateError, match=message):
        resume_start(data, trainer[0], trainer[1], LENGTH, where=" (train loader 'a')")


def test_before_the_trainers_count_is_known_only_a_next_epoch_is_told_and_nothing_refused() -> None:
    assert resume_start(DataPlace(2, 8, over=True), 3) is Start.NEXT_EPOCH
    assert resume_start(DataPlace(2, 8, over=True), 2) is Start.EPOCH_ENDS
    assert resume_start(DataPlace(2, 3), 5) is Start.AT_POSITION  # refused at the train start, its count known
    assert resume_start(DataPlace(2, 9), 2, epoch_length=LENGTH) is Start.EPOCH_CUT


def test_an_unknown_or_infinite_length_cuts_nothing() -> None:
    for length in (None, 0, float("inf")):
        assert resume_start(DataPlace(2, 9), 2, 9, length) is Start.AT_POSITION
        with pytest.raises(IncompatibleStateError, match="resumes epoch 2 but the trainer resumes epoch 3"):
            resume_start(DataPlace(2, 9), 3, 0, length)
