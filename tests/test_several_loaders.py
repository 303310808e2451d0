"""Several train loaders in a real (single-process) Trainer: exact resume in each mode, and refusals of a
checkpoint whose loaders, keys or mode differ."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_resumable import (
    IncompatibleStateError,
    ResumableBatchSampler,
    ResumableDataCallback,
    ResumableDataModule,
    UnsupportedLoaderError,
)

from .helpers import Counting, Data, SaveAtStep, Several, assert_resumes_exactly, ids, trainer


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[dict[str, Any]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        parts = batch if isinstance(batch, dict) else {"": batch}
        self.seen.append({key: None if part is None else part[0].flatten().tolist() for key, part in parts.items()})
        return sum(self.layer(part[0]).mean() for part in parts.values() if part is not None)  # type: ignore[return-value]

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("mode", ["max_size_cycle", "max_size", "min_size"])
@pytest.mark.parametrize("stop", [2, 3])
def test_a_combined_loader_resumes_exactly(tmp_path: Path, mode: str, stop: int) -> None:
    """The short loader has 3 batches: the stops fall in its first cycle and exactly at its restart."""
    L.seed_everything(11)  # the run's seed: the resume takes it from the checkpoint
    assert_resumes_exactly(tmp_path, Model, lambda: Several(mode=mode), stop=stop, max_epochs=2)


def checkpoint(tmp_path: Path, data: L.LightningDataModule) -> Path:
    path = tmp_path / "mid.ckpt"
    trainer(tmp_path, [ResumableDataCallback(), SaveAtStep(2, path)]).fit(Model(), data)
    return path


def test_other_keys_or_another_mode_are_refused(tmp_path: Path) -> None:
    path = checkpoint(tmp_path, Several())
    with pytest.raises(IncompatibleStateError, match=r"train loaders \['a', 'b'\] in max_size_cycle mode"):
        trainer(tmp_path, [ResumableDataCallback()]).fit(Model(), Several(keys=("a", "c")), ckpt_path=path)
    with pytest.raises(IncompatibleStateError, match="now they are"):
        trainer(tmp_path, [ResumableDataCallback()]).fit(Model(), Several(mode="min_size"), ckpt_path=path)


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("max_size_cycle", "the shorter loaders would restart at other steps"),
        ("min_size", "would end at another sample of the others"),
        ("max_size", "not built for several loaders"),
    ],
)
def test_another_batch_size_is_refused_saying_why_it_would_not_be_exact(tmp_path: Path, mode: str, why: str) -> None:
    path = checkpoint(tmp_path, Several(mode=mode))
    with pytest.raises(
        IncompatibleStateError, match=r"other batch sizes per process \('a': 2 -> 3, 'b': 2 -> 3\)"
    ) as refusal:
        trainer(tmp_path, [ResumableDataCallback()]).fit(Model(), Several(mode=mode, batch_size=3), ckpt_path=path)
    assert why in str(refusal.value)


@pytest.mark.parametrize("mode", ["max_size", "min_size"])
def test_loaders_built_again_every_epoch_with_workers_read_each_epoch_as_loaders_built_once(
    tmp_path: Path, mode: str
) -> None:
    """Lightning's reload makes an iterator it never reads, then the one it trains from; the first's 2 workers
    prefetch the short loader's whole pass (3 batches). That pass is read again, not taken as read: the short loader
    yielded nothing after the first epoch, and ``min_size`` ended every later epoch before its first step."""
    runs = []
    for reload in (0, 1):
        L.seed_everything(11)
        model = Model()
        fit = trainer(
            tmp_path / str(reload), [ResumableDataCallback()], max_epochs=3, reload_dataloaders_every_n_epochs=reload
        )
        fit.fit(model, Several(mode=mode, num_workers=2))
        runs.append(model.seen)
    assert len(runs[0]) == 3 * {"max_size": 6, "min_size": 3}[mode]
    assert runs[1] == runs[0]


def test_a_loader_whose_cycle_a_reload_prefetches_whole_in_max_size_cycle_mode_is_refused(tmp_path: Path) -> None:
    """Its sampler would take the pass the reload's unread iterator prefetched as read: each reloaded epoch would
    begin at the next cycle, a resume there at the first. Refused before any step; without the reload, or with
    more batches than the workers prefetch, it trains."""
    reloading = trainer(tmp_path, [ResumableDataCallback()], max_epochs=2, reload_dataloaders_every_n_epochs=1)
    with pytest.raises(UnsupportedLoaderError, match=r"'b' has 3 batches per process, which its 2 workers prefetch"):
        reloading.fit(Model(), Several(mode="max_size_cycle", num_workers=2))
    assert reloading.global_step == 0
    trainer(tmp_path, [ResumableDataCallback()], max_epochs=2).fit(
        Model(), Several(mode="max_size_cycle", num_workers=2)
    )
    fewer = trainer(tmp_path, [ResumableDataCallback()], max_epochs=2, reload_dataloaders_every_n_epochs=1)
    fewer.fit(Model(), Several(mode="max_size_cycle", num_workers=1, batch_size=1))  # 5 batches, 2 prefetched
    assert fewer.global_step == 2 * 12


def test_a_checkpoint_of_one_loader_is_refused_for_several_and_the_reverse(tmp_path: Path) -> None:
    single = checkpoint(tmp_path / "single", Data())
    with pytest.raises(IncompatibleStateError, match="holds the state of one map-style train loader"):
        trainer(tmp_path, [ResumableDataCallback()]).fit(Model(), Several(), ckpt_path=single)
    several = checkpoint(tmp_path / "several", Several())
    with pytest.raises(IncompatibleStateError, match="holds the state of several train loaders"):
        trainer(tmp_path, [ResumableDataCallback()]).fit(Model(), Data(), ckpt_path=several)


def test_a_stream_among_several_loaders_is_refused(tmp_path: Path) -> None:
    class WithStream(ResumableDataModule, L.LightningDataModule):
        def train_dataloader(self) -> Any:
            return {"map": DataLoader(ids(8, 0), batch_size=2), "stream": DataLoader(Counting(), batch_size=2)}

    with pytest.raises(UnsupportedLoaderError, match="'stream' reads a stream"):
        trainer(tmp_path, [ResumableDataCallback()], max_steps=1).fit(Model(), WithStream())


def test_a_batch_sampler_among_several_loaders_is_refused(tmp_path: Path) -> None:
    """docs/streams-and-loaders.md: a ``ResumableBatchSampler``'s epochs may differ in length, which several loaders'
    shared epoch cannot follow yet."""

    class Pairs(ResumableBatchSampler):
        def epoch_batches(self, epoch: int, generator: torch.Generator) -> list[list[int]]:
            return [[index, index + 1] for index in range(0, 8, 2)]

    class WithBatches(ResumableDataModule, L.LightningDataModule):
        def train_dataloader(self) -> Any:
            batches = Pairs()
            return {"map": DataLoader(ids(8, 0), batch_size=2), "pairs": DataLoader(ids(8, 0), batch_sampler=batches)}

    with pytest.raises(UnsupportedLoaderError, match="'pairs' has a ResumableBatchSampler"):
        trainer(tmp_path, [ResumableDataCallback()], max_steps=1).fit(Model(), WithBatches())
