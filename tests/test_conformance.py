"""The seams' conformance suite: every stream reader passes the same save/restore/compare check
(`helpers.assert_reader_resumes_exactly`; LitData's and Mosaic's readers in their internals tests),
and every owner of the train input (one map-style loader, several in each ``CombinedLoader`` mode, a
stream) resumes exactly through a real ``Trainer`` (`helpers.assert_resumes_exactly`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_resumable import ResumableDataModule
from lightning_resumable.core.verification import digest_of

from .helpers import Counting, Data, Several, assert_reader_resumes_exactly, assert_resumes_exactly, stream_loader


@pytest.mark.parametrize("workers", [(0, 0), (2, 2)])
def test_the_torchdata_stream_reader_passes_the_readers_suite(workers: tuple[int, int]) -> None:
    assert_reader_resumes_exactly(lambda epoch, num_workers: stream_loader(num_workers, epoch), stop=3, workers=workers)


class Recorder(L.LightningModule):
    """Records the digest of each step's batch, whatever the train input's kind."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))
        self.seen: list[str] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen.append(digest_of(batch))
        return (self.weight - 1.0) ** 2

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class StreamData(ResumableDataModule, L.LightningDataModule):
    def __init__(self, num_workers: int) -> None:
        super().__init__()
        self.num_workers = num_workers

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(Counting(12), batch_size=2, num_workers=self.num_workers)


OWNED = {
    "one map-style loader": (Data, 3),
    "several, max_size_cycle": (lambda: Several(mode="max_size_cycle"), 4),
    "several, max_size": (lambda: Several(mode="max_size"), 4),
    "several, min_size": (lambda: Several(mode="min_size"), 2),
    "a stream": (lambda: StreamData(0), 4),
    "a stream read by 2 workers": (lambda: StreamData(2), 4),
}


@pytest.mark.parametrize("kind", OWNED)
def test_every_owner_resumes_exactly_through_a_trainer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    monkeypatch.setenv("PL_GLOBAL_SEED", "3")  # the three runs share a seed (else each draws its own)
    make_data, stop = OWNED[kind]
    full = assert_resumes_exactly(tmp_path, Recorder, make_data, stop=stop, max_epochs=2)
    assert len(full) > stop + 1, "the stop lies inside the run"
