"""The pass-through contract is checked at build and at every save; a dataset's own state is persisted once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import lightning_resumable.lightning.sampled_loader as sampled_loader_module
from lightning_resumable import (
    ContractViolationError,
    IncompatibleStateError,
    InconsistentRankStateError,
    PassThroughWrapper,
    ResumableDataCallback,
    ResumableDataModule,
)
from lightning_resumable.readers.build import make_resumable
from lightning_resumable.readers.contract import check_contract, pipeline

from .helpers import Model, SaveAtStep, trainer


class Curriculum(Dataset[torch.Tensor]):
    """A dataset with state of its own: the difficulty level, raised at each epoch's end."""

    def __init__(self, extra_state: dict[str, Any] | None = None) -> None:
        self.level = 0
        self.extra_state = extra_state or {}

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([float(index), float(self.level)])

    def state_dict(self) -> dict[str, Any]:
        return {"level": self.level, **self.extra_state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.level = state["level"]


class Halves(PassThroughWrapper, Dataset[torch.Tensor]):
    """A correct wrapper: it derives its offset, and persists only its inner dataset's state."""

    derived_attributes = ("offset",)

    def __init__(self, dataset: Dataset[torch.Tensor], offset: int) -> None:
        super().__init__(dataset)
        self.offset = offset

    def __len__(self) -> int:
        return len(self.inner) // 2

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.inner[2 * index + self.offset]  # type: ignore[no-any-return]


class ShardOffsetWrapper(Dataset[torch.Tensor]):
    """Seed 000's bug: a hand-written wrapper that adds its derived shard offset to its inner state."""

    def __init__(self, dataset: Curriculum, rank: int) -> None:
        self.dataset, self.shard_offset = dataset, rank * 4

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.dataset[index]

    def state_dict(self) -> dict[str, Any]:
        return {**self.dataset.state_dict(), "shard_offset": self.shard_offset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dataset.load_state_dict(state)


class CursorWrapper(ShardOffsetWrapper):
    """A wrapper that keeps state of its own under an innocent name: still not its inner's state."""

    def state_dict(self) -> dict[str, Any]:
        return {**self.dataset.state_dict(), "cursor": 3}


def built(dataset: Dataset[Any]) -> DataLoader[Any]:
    return make_resumable(DataLoader(dataset, batch_size=2), seed=1, num_replicas=1, rank=0)


def check(loader: DataLoader[Any]) -> None:
    check_contract(loader, owned=(loader.sampler,))


# ------------------------------------------------------------------------------ the base class
def test_a_wrapper_passes_its_inner_state_through_and_reads_attributes_through() -> None:
    inner = Curriculum()
    wrapper = Halves(Halves(inner, 0), 1)
    inner.level = 3
    assert wrapper.state_dict() == {"level": 3}
    wrapper.load_state_dict({"level": 5})
    assert inner.level == 5 and wrapper.level == 5
    assert len(wrapper) == 2


def test_a_wrapper_cannot_define_its_own_state() -> None:
    with pytest.raises(ContractViolationError, match=r"Sneaky defines state_dict\(\)"):

        class Sneaky(PassThroughWrapper):
            def state_dict(self) -> dict[str, Any]:
                return {"offset": 1}


def test_a_wrapper_of_a_stateless_object_refuses_state() -> None:
    with pytest.raises(ContractViolationError, match="has no load_state_dict"):
        Halves(torch.utils.data.TensorDataset(torch.zeros(4)), 0).load_state_dict({"level": 1})


# ---------------------------------------------------------------------------------- the walk
def test_the_walk_reaches_every_object_of_the_chain_with_its_path() -> None:
    inner = Curriculum()
    loader = built(Halves(Halves(inner, 0), 1))
    paths = {path: node for path, node in pipeline(loader)}
    assert paths["loader.dataset.dataset.inner.inner"] is inner
    assert paths["loader.sampler"] is loader.sampler
    assert paths["loader.batch_sampler"] is loader.batch_sampler


def test_nested_pass_through_wrappers_keep_the_contract() -> None:
    check(built(Halves(Halves(Curriculum(), 0), 1)))


@pytest.mark.parametrize(
    ("dataset", "named"),
    [
        (ShardOffsetWrapper(Curriculum(), rank=1), r"ShardOffsetWrapper at loader\.dataset\.dataset .*'shard_offset'"),
        (
            Halves(Halves(Curriculum({"meta": {"cursor": {"rank": 0}}}), 0), 1),
            r"Curriculum at loader\.dataset\.dataset\.inner\.inner persists the key 'rank' "
            r"\(state\['meta'\]\['cursor'\]\['rank'\]\)",
        ),
        (Halves(Curriculum({"offset": 4}), 0), r"Curriculum at loader\.dataset\.dataset\.inner .*'offset'"),
        (
            CursorWrapper(Curriculum(), rank=0),
            r"CursorWrapper at loader\.dataset\.dataset persists a state that differs from that of the Curriculum"
            r" it wraps \(loader\.dataset\.dataset\.dataset\); keys that differ: \['cursor'\]",
        ),
    ],
    ids=["derived key in a wrapper", "derived key at depth", "declared derived attribute", "wrapper adds state"],
)
def test_each_kind_of_violation_is_refused_naming_class_path_and_key(dataset: Dataset[Any], named: str) -> None:
    with pytest.raises(ContractViolationError, match=named):
        check(built(dataset))


# ------------------------------------------------------------------- under a Trainer: build, save
class CurriculumData(ResumableDataModule, L.LightningDataModule):
    def __init__(self, dataset: Dataset[Any]) -> None:
        super().__init__()
        self.dataset = dataset

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.dataset, batch_size=2, shuffle=True)


class CurriculumModel(Model):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen = [*getattr(self, "seen", []), batch[:, 1].tolist()]
        return self.layer(batch[:, :1]).mean()

    def on_train_epoch_end(self) -> None:
        dataset = self.trainer.datamodule.dataset  # type: ignore[attr-defined]
        dataset.level += 1
        if getattr(dataset, "leak_rank_after_epoch", False):
            dataset.extra_state = {"worker_id": 0}


def test_a_violation_is_refused_when_the_loader_is_built(tmp_path: Path) -> None:
    with pytest.raises(ContractViolationError, match=r"ShardOffsetWrapper at loader\.dataset\.dataset "):
        trainer(tmp_path, [ResumableDataCallback()]).fit(Model(), CurriculumData(ShardOffsetWrapper(Curriculum(), 0)))


def test_a_violation_that_appears_later_is_refused_at_the_save(tmp_path: Path) -> None:
    dataset = Curriculum()
    dataset.leak_rank_after_epoch = True  # type: ignore[attr-defined]
    fitted = trainer(tmp_path, [ResumableDataCallback()], max_epochs=1)
    fitted.fit(CurriculumModel(), CurriculumData(dataset))
    with pytest.raises(
        ContractViolationError, match=r"Curriculum at loader\.dataset\.dataset persists the key 'worker_id'"
    ):
        fitted.save_checkpoint(tmp_path / "late.ckpt")


def save_in_epoch_one(tmp_path: Path) -> Path:
    path = tmp_path / "curriculum.ckpt"

    trainer(tmp_path, [ResumableDataCallback(), SaveAtStep(6, path)], max_epochs=3).fit(
        CurriculumModel(), CurriculumData(Curriculum())
    )
    return path


def test_a_datasets_own_state_is_persisted_once_and_restored_before_the_first_batch(tmp_path: Path) -> None:
    full = CurriculumModel()
    trainer(tmp_path, [ResumableDataCallback()], max_epochs=3).fit(full, CurriculumData(Curriculum()))
    path = save_in_epoch_one(tmp_path)
    assert torch.load(path, weights_only=True)["callbacks"]["ResumableDataCallback"]["state"]["dataset"] == {"level": 1}
    resumed = CurriculumModel()
    data = CurriculumData(Curriculum())
    trainer(tmp_path, [ResumableDataCallback()], max_epochs=3).fit(resumed, data, ckpt_path=path)
    assert resumed.seen == full.seen[6:]  # levels 1, 1 then 2 x4, as uninterrupted


def test_ranks_holding_different_dataset_states_are_refused_at_the_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fitted = trainer(tmp_path, [ResumableDataCallback()], max_epochs=1)
    fitted.fit(CurriculumModel(), CurriculumData(Curriculum()))
    real_gather = sampled_loader_module.all_gather_objects

    def two_ranks_disagreeing(value: Any) -> list[Any]:
        mine = real_gather(value)[0]
        return [mine, "another rank's digest"] if isinstance(mine, str) else [mine, mine]

    monkeypatch.setattr(sampled_loader_module, "all_gather_objects", two_ranks_disagreeing)
    with pytest.raises(InconsistentRankStateError, match=r"different state on rank\(s\) \[1\] than on rank 0"):
        fitted.save_checkpoint(tmp_path / "split.ckpt")


def test_a_checkpoint_without_the_datasets_state_is_refused(tmp_path: Path) -> None:
    path = save_in_epoch_one(tmp_path)
    checkpoint = torch.load(path, weights_only=True)
    del checkpoint["callbacks"]["ResumableDataCallback"]["state"]["dataset"]
    torch.save(checkpoint, path)
    with pytest.raises(IncompatibleStateError, match="has its own state, but the checkpoint holds none"):
        trainer(tmp_path, [ResumableDataCallback()], max_epochs=3).fit(
            CurriculumModel(), CurriculumData(Curriculum()), ckpt_path=path
        )
