"""The batches a map-style loader produced: recorded where they sit, read ahead at a save without
changing what the loader hands out (torch's ``_next_data`` and ``_num_yielded``, tested against the
torch CI installs), with and without workers and persistent workers."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_resumable.core.produced import ProducedBatches, watch_loader
from lightning_resumable.core.verification import digest_of


class Squares(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([index * index])


def watched(workers: int, persistent: bool = False) -> tuple[DataLoader[Any], ProducedBatches]:
    loader = DataLoader(Squares(), batch_size=3, num_workers=workers, persistent_workers=persistent)
    produced = ProducedBatches(lambda: (0, 0, 0))
    watch_loader(loader, produced)
    return loader, produced


@pytest.mark.parametrize(("workers", "persistent"), [(0, False), (2, False), (2, True)])
def test_a_batch_read_ahead_at_a_save_is_the_one_handed_out_next(workers: int, persistent: bool) -> None:
    loader, produced = watched(workers, persistent)
    plain = [batch.tolist() for batch in DataLoader(Squares(), batch_size=3)]
    for _ in range(2):  # a second pass: a persistent iterator is reset, not made again
        iterator, handed_out = iter(loader), []
        handed_out.append(next(iterator).tolist())
        ahead = produced.digest_at(0, 0, 1)  # a save after 1 batch: batch 1 read now
        assert ahead != "" and produced.digest_at(0, 0, 1) == ahead, "read once, then kept"
        second = next(iterator)
        assert digest_of(second) == ahead
        handed_out += [second.tolist(), *(batch.tolist() for batch in iterator)]
        assert handed_out == plain, "reading ahead changed nothing the loader hands out"


def test_a_batch_not_next_is_not_read_and_an_exhausted_pass_ends_where_it_would() -> None:
    loader, produced = watched(0)
    iterator = iter(loader)
    next(iterator)
    assert produced.digest_at(0, 0, 3) == "", "batch 3 is not the next one: nothing is read"
    assert produced.digest_at(1, 0, 1) == "", "another epoch: nothing is read"
    for _ in range(3):
        next(iterator)
    assert produced.digest_at(0, 0, 4) == "", "past the end: the pass's StopIteration is kept"
    with pytest.raises(StopIteration):
        next(iterator)


def test_the_first_batch_after_a_restore_is_compared_only_where_it_was_expected() -> None:
    loader, produced = watched(0)
    expected = digest_of(next(iter(loader)))
    produced.expect_first((0, 0, 0), expected)
    next(iter(loader))
    assert produced.first_batch == (expected, expected)
    produced.expect_first((0, 0, 2), expected)  # Lightning started elsewhere (the epoch had ended)
    next(iter(loader))
    assert produced.first_batch is None
