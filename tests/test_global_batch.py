"""A stream's first global batch after a resume on another layout, checked sample by sample
(`lightning_resumable.core.global_batch`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from lightning_resumable import ResumeVerificationError
from lightning_resumable.core.global_batch import check_first_global_batch, sample_digests


def samples(count: int, first: int = 0) -> list[dict[str, object]]:
    return [
        {"id": first + index, "x": torch.full((3,), float(first + index)), "name": f"s{first + index}"}
        for index in range(count)
    ]


def test_a_samples_digest_does_not_depend_on_the_batch_it_was_collated_in() -> None:
    """Eight samples as two batches of 4 (two ranks) and as one batch of 8 (one rank): the same digests."""
    eight = samples(8)
    halves = sample_digests(default_collate(eight[:4]), 4) + sample_digests(default_collate(eight[4:]), 4)
    whole = sample_digests(default_collate(eight), 8)
    assert len(set(whole)) == 8 and halves == whole


@pytest.mark.parametrize(
    "collated",
    [
        lambda rows: default_collate(rows),  # a dict of batched fields, strings as a list
        lambda rows: default_collate([(row["x"], row["id"]) for row in rows]),  # a list of batched fields
        lambda rows: torch.stack([row["x"] for row in rows]),  # one tensor
        lambda rows: np.stack([row["x"].numpy() for row in rows]),  # an array
        lambda rows: [row["name"] for row in rows],  # a list of samples
    ],
    ids=["dict", "fields", "tensor", "array", "list"],
)
def test_each_collation_is_split_into_its_samples(collated: object) -> None:
    assert callable(collated)
    rows = samples(5)
    digests = sample_digests(collated(rows), 5)
    assert len(digests) == 5 and len(set(digests)) == 5
    assert sample_digests(collated(rows[:3]), 5) == digests[:3], "a last, partial batch"


def test_a_batch_whose_samples_cannot_be_told_apart_gives_no_digests() -> None:
    assert sample_digests(torch.tensor(3.0), 4) == []  # no first dimension
    assert sample_digests({"x": torch.zeros(4, 2), "y": torch.zeros(3)}, 4) == []  # fields of other lengths
    two = [torch.zeros(2), torch.ones(2)]  # 2 batched fields, or 2 samples of 2 values: not known
    assert sample_digests(two, 2) == []
    assert sample_digests("text", 4) == []


def test_the_global_batch_is_checked_as_a_multiset() -> None:
    recorded = [sample_digests(default_collate(samples(4)), 4), sample_digests(default_collate(samples(4, 4)), 4)]
    everything = recorded[0] + recorded[1]
    dealt = [everything[::-1]]  # one rank, the samples in another order
    assert check_first_global_batch(recorded, dealt, 1, 3) == ""
    other = [everything[:-1] + sample_digests(default_collate(samples(1, 99)), 1)]
    with pytest.raises(ResumeVerificationError, match="1 of the 8 samples of the checkpoint's"):
        check_first_global_batch(recorded, other, 1, 3)


def test_another_global_batch_size_holds_the_smaller_within_the_larger() -> None:
    """Another batch size regroups one global sequence (Mosaic's): the checkpoint's next global batch and the resumed
    run's first hold the same first samples, the smaller all within the larger."""
    recorded = [sample_digests(default_collate(samples(4)), 4), sample_digests(default_collate(samples(4, 4)), 4)]
    everything = recorded[0] + recorded[1]
    assert check_first_global_batch(recorded, [everything[5:1:-1]], 1, 3) == "", "a smaller one, read on 1 process"
    larger = [everything[4:] + sample_digests(default_collate(samples(4, 8)), 4), everything[:4]]
    assert check_first_global_batch(recorded, larger, 1, 3) == "", "a larger one"
    stray = sample_digests(default_collate(samples(1, 99)), 1)
    with pytest.raises(ResumeVerificationError, match="1 of the 4 samples of the resumed run's"):
        check_first_global_batch(recorded, [everything[:3] + stray], 1, 3)
    with pytest.raises(ResumeVerificationError, match="1 of the 8 samples of the checkpoint's"):
        check_first_global_batch([everything[:7] + stray], larger, 1, 3)


def test_an_epochs_last_global_batch_may_differ_by_the_samples_each_layout_repeats() -> None:
    """The last global batch of an epoch holds samples a layout repeats to share it among its ranks (up to one per
    rank): so many may differ there, and the resume is logged as not verified; more are refused, and elsewhere none
    may differ."""
    recorded = [sample_digests(default_collate(samples(4)), 4), sample_digests(default_collate(samples(4, 4)), 4)]
    everything = recorded[0] + recorded[1]
    repeated = [everything[:7] + everything[:1]]  # 2 saving ranks and 1 resumed: up to 2 may differ
    assert "differ, as its layouts repeat" in check_first_global_batch(recorded, repeated, 1, 3, epoch_end=True)
    with pytest.raises(ResumeVerificationError):
        check_first_global_batch(recorded, repeated, 1, 3)
    strays = sample_digests(default_collate(samples(3, 99)), 3)
    with pytest.raises(ResumeVerificationError, match="3 of the 8"):
        check_first_global_batch(recorded, [everything[:5] + strays], 1, 3, epoch_end=True)


def test_what_cannot_be_compared_is_not_checked_and_says_why() -> None:
    recorded = [sample_digests(default_collate(samples(4)), 4)]
    assert "cannot be told apart" in check_first_global_batch([[]], recorded, 0, 1)
    assert "cannot be told apart" in check_first_global_batch(recorded, [None], 0, 1)
