"""Misconfigurations and incompatible checkpoints are refused with specific errors (single process)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_resumable import (
    IncompatibleStateError,
    MissingCallbackError,
    MissingStateError,
    ResumableDataCallback,
    ResumableDataModule,
    ResumableSampler,
    StateFormatError,
    WorldSizeChangedError,
)
from lightning_resumable.lightning.owners import LoaderOwner

from .helpers import Data, Model, PlainData, SaveAtStep, assert_resumes_exactly, checkpoint_with_callback, trainer


def test_mixin_without_callback_is_refused(tmp_path: Path) -> None:
    with pytest.raises(MissingCallbackError, match=r"needs a ResumableDataCallback .*found none"):
        trainer(tmp_path, []).fit(Model(), Data())


def test_two_callbacks_are_refused(tmp_path: Path) -> None:
    """Lightning refuses two of one state key; a subclass with its own key gets this far."""
    from lightning_resumable import DuplicateCallbackError

    class Renamed(ResumableDataCallback):
        @property
        def state_key(self) -> str:
            return "renamed"

    with pytest.raises(DuplicateCallbackError, match=r"exactly one ResumableDataCallback .*found 2"):
        trainer(tmp_path, [ResumableDataCallback(), Renamed()]).fit(Model(), Data())


def test_callback_without_mixin_is_refused(tmp_path: Path) -> None:
    with pytest.raises(MissingCallbackError, match="make the datamodule a ResumableDataModule"):
        trainer(tmp_path, [ResumableDataCallback()]).fit(Model(), PlainData())


def test_train_dataloader_outside_a_trainer_is_refused() -> None:
    from lightning_resumable import NoTrainerError

    with pytest.raises(NoTrainerError, match="runs under a Trainer"):
        Data().train_dataloader()


def test_checkpoint_without_data_state_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "plain.ckpt"
    plain = trainer(tmp_path, [])
    plain.fit(Model(), PlainData())
    plain.save_checkpoint(path)
    with pytest.raises(MissingStateError, match="written without ResumableDataCallback"):
        trainer(tmp_path, [ResumableDataCallback()], max_epochs=2).fit(Model(), Data(), ckpt_path=path)


@pytest.mark.parametrize("emptied", [{}, None, 0, [], False, ""], ids=repr)
def test_a_mid_epoch_checkpoint_with_an_emptied_data_state_is_refused(tmp_path: Path, emptied: object) -> None:
    """Lightning hands no falsy state to ``load_state_dict``: the data used to restart at batch 0 while
    Lightning counted from batch 3 (3 batches repeated, 3 skipped), with only a warning."""
    path = checkpoint_with_callback(tmp_path)
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["callbacks"]["ResumableDataCallback"] = emptied
    torch.save(checkpoint, path)
    with pytest.raises(MissingStateError, match=r"data state is empty .* written after 3 train batches"):
        trainer(tmp_path, [ResumableDataCallback()], max_epochs=2).fit(Model(), Data(), ckpt_path=path)


PARTIAL_SLOTS = [
    {"format": 1, "kind": "loader", "keys": 1},
    {"format": 1, "kind": "loader", "keys": 1, "state": {}},
    {"format": 1, "kind": "stream", "keys": 1, "state": None},
    {"partial_accumulation": {"accumulated": 1, "window": 2, "batches": 3}},
]


@pytest.mark.parametrize("slot", PARTIAL_SLOTS, ids=["no-state", "empty-state", "None-state", "only-a-mark"])
def test_a_mid_epoch_checkpoint_with_a_partial_data_state_is_refused(tmp_path: Path, slot: dict[str, Any]) -> None:
    """A slot that holds the envelope or a mark but not the state of its kind is as unknown a position."""
    path = checkpoint_with_callback(tmp_path)
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["callbacks"]["ResumableDataCallback"] = slot
    torch.save(checkpoint, path)
    with pytest.raises(MissingStateError, match=r"data state is partial .* written after 3 train batches"):
        trainer(tmp_path, [ResumableDataCallback()], max_epochs=2).fit(Model(), Data(), ckpt_path=path)


def test_checkpoint_of_another_dataset_size_is_refused(tmp_path: Path) -> None:
    path = checkpoint_with_callback(tmp_path)
    with pytest.raises(IncompatibleStateError, match="dataset_size: checkpoint 16, now 18"):
        trainer(tmp_path, [ResumableDataCallback()]).fit(Model(), Data(size=18), ckpt_path=path)


def test_changed_world_size_is_refused_when_the_callback_is_strict(tmp_path: Path) -> None:
    path = checkpoint_with_callback(tmp_path)
    checkpoint = torch.load(path, weights_only=True)
    state = checkpoint["callbacks"]["ResumableDataCallback"]["state"]["train"]
    state["world_size"], state["position"] = 2, 2 * state["position"]  # as 2 processes would have written it
    del checkpoint["callbacks"]["ResumableDataCallback"]["state"]["next_batch"]  # one rank's fingerprint: drop it
    torch.save(checkpoint, path)
    strict = ResumableDataCallback(allow_world_size_change=False)
    with pytest.raises(WorldSizeChangedError, match="written on 2 processes and resumes on 1"):
        trainer(tmp_path, [strict]).fit(Model(), Data(), ckpt_path=path)


def test_data_state_disagreeing_with_trainer_progress_is_refused(tmp_path: Path) -> None:
    path = checkpoint_with_callback(tmp_path)
    checkpoint = torch.load(path, weights_only=True)
    state = checkpoint["callbacks"]["ResumableDataCallback"]["state"]["train"]
    state["batches"], state["position"] = 2, 4
    torch.save(checkpoint, path)
    with pytest.raises(
        IncompatibleStateError, match=r"resumes after 2 batches of epoch 0 but the trainer.s count means 3"
    ):
        trainer(tmp_path, [ResumableDataCallback()]).fit(Model(), Data(), ckpt_path=path)


@pytest.mark.parametrize("position", [8, 40], ids=["one-batch-ahead", "past-the-epoch"])
def test_a_position_moved_off_the_trainers_count_is_refused(tmp_path: Path, position: int) -> None:
    """With the fingerprints removed, a position past the epoch used to skip the rest of it silently."""
    path = checkpoint_with_callback(tmp_path)
    checkpoint = torch.load(path, weights_only=True)
    saved = checkpoint["callbacks"]["ResumableDataCallback"]["state"]
    del saved["next_batch"]
    assert (saved["train"]["position"], saved["train"]["batches"]) == (6, 3)
    saved["train"]["position"] = position
    torch.save(checkpoint, path)
    with pytest.raises(StateFormatError, match=f"position {position} is not where 3 batches of 2 on 1 processes"):
        trainer(tmp_path, [ResumableDataCallback()]).fit(Model(), Data(), ckpt_path=path)


def test_a_resume_on_another_world_size_anchors_the_positions_after_it(tmp_path: Path) -> None:
    """Saved after 3 batches on 2 processes (position 12), resumed on 1: the next save, one batch later,
    is at position 12 + 2 and records its anchor there, and that checkpoint resumes in turn."""
    path = checkpoint_with_callback(tmp_path)
    checkpoint = torch.load(path, weights_only=True)
    saved = checkpoint["callbacks"]["ResumableDataCallback"]["state"]
    saved["train"]["world_size"], saved["train"]["position"] = 2, 12
    del saved["next_batch"]  # one rank's fingerprint
    torch.save(checkpoint, path)
    again = tmp_path / "again.ckpt"
    trainer(tmp_path, [ResumableDataCallback(), SaveAtStep(4, again)]).fit(Model(), Data(), ckpt_path=path)
    state = torch.load(again, weights_only=True)["callbacks"]["ResumableDataCallback"]["state"]["train"]
    assert [state[key] for key in ("position", "batches", "anchor_position", "anchor_batches")] == [14, 4, 12, 3]
    trainer(tmp_path, [ResumableDataCallback()]).fit(Model(), Data(), ckpt_path=again)


def test_single_process_resume_is_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fast in-process check of the whole path; the DDP matrix is in tests/e2e."""
    monkeypatch.setenv("PL_GLOBAL_SEED", "3")
    full = assert_resumes_exactly(tmp_path, Model, Data, stop=3, max_epochs=2)
    assert len(full) == 16


def test_a_loader_built_mid_run_starts_at_the_trainers_epoch() -> None:
    """A reloaded loader may be iterated (workers prefetch) before Lightning's set_epoch."""
    sampler = ResumableSampler(range(16), num_replicas=1, rank=0)
    ResumableDataCallback().take(LoaderOwner(DataLoader(range(16), sampler=sampler)), current_epoch=3)
    assert sampler.origin == (3, 0, 0)


def test_a_train_dataloader_inherited_from_a_base_class_is_made_resumable(tmp_path: Path) -> None:
    class Inherited(ResumableDataModule, PlainData):
        pass

    callback = ResumableDataCallback()
    trainer(tmp_path, [callback], max_steps=1).fit(Model(), Inherited())
    assert isinstance(callback.sampler, ResumableSampler)


def test_validating_a_checkpoint_without_data_state_is_allowed(tmp_path: Path) -> None:
    path = tmp_path / "plain.ckpt"
    plain = trainer(tmp_path, [], max_steps=1)
    plain.fit(Model(), PlainData())
    plain.save_checkpoint(path)

    class Validating(Model):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            pass

        def val_dataloader(self) -> DataLoader[Any]:
            return DataLoader(TensorDataset(torch.zeros(2, 1)), batch_size=2)

    trainer(tmp_path, [ResumableDataCallback()]).validate(Validating(), ckpt_path=path)


def test_a_reloaded_train_loader_retires_the_last_ones_workers_before_its_own_fork(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``reload_dataloaders_every_n_epochs=1`` builds a new loader each epoch; the last one's iterator was
    left to the garbage collector, which reached it right after the new workers forked, and its workers
    then took the join's full timeout to end (about 5 s each: benchmarks/reload_cost.py)."""
    from lightning_resumable.lightning import owners

    events: list[str] = []
    retire = owners.LoaderOwner.retire_workers
    monkeypatch.setattr(owners.LoaderOwner, "retire_workers", lambda self: events.append("retired") or retire(self))

    class Reloaded(Data):
        def train_dataloader(self) -> DataLoader[Any]:
            events.append("built")
            return DataLoader(TensorDataset(torch.arange(8.0).unsqueeze(1)), batch_size=2, num_workers=1)

    trainer(tmp_path, [ResumableDataCallback()], max_epochs=3, reload_dataloaders_every_n_epochs=1).fit(
        Model(), Reloaded()
    )
    # Each loader after the first is built by the user's code, then the last one's workers are retired,
    # before the new one is iterated; the last loader's workers end with the fit.
    order = "".join(event[0] for event in events)
    assert order.count("b") == 3 and all(order[at + 1] == "r" for at in range(1, len(order)) if order[at] == "b"), order
    assert order.endswith("r"), order
