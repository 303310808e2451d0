"""A resume checks itself: the batch after the checkpoint must be the one the checkpoint recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_resumable import ResumableDataCallback, ResumableDataModule, ResumeVerificationError, StateFormatError
from lightning_resumable.core.verification import digest_of
from lightning_resumable.format.envelope import BatchFingerprint

from .helpers import Model, SaveAtStep, trainer


class Rows(Dataset[torch.Tensor]):
    """16 rows; ``relisted`` reads them in another order, ``scale`` changes the 'transform'."""

    def __init__(self, relisted: bool = False, scale: float = 1.0) -> None:
        self.relisted, self.scale = relisted, scale

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> torch.Tensor:
        row = (index + 1) % 16 if self.relisted else index
        return torch.tensor([float(row) * self.scale]) + torch.rand(1) * 0.01  # with a random augmentation


class RowsData(ResumableDataModule, L.LightningDataModule):
    def __init__(self, **dataset_kwargs: Any) -> None:
        super().__init__()
        self.dataset_kwargs = dataset_kwargs

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(Rows(**self.dataset_kwargs), batch_size=2, shuffle=True)


class RowModel(Model):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.trained_steps = getattr(self, "trained_steps", 0) + 1
        return self.layer(batch).mean()


def save_mid_epoch(tmp_path: Path) -> Path:
    path = tmp_path / "mid.ckpt"

    trainer(tmp_path, [ResumableDataCallback(), SaveAtStep(3, path)], max_epochs=2).fit(RowModel(), RowsData())
    return path


@pytest.mark.parametrize(
    ("changed", "named"),
    [({"relisted": True}, "same sample keys but different content"), ({"scale": 2.0}, "transforms changed")],
)
def test_changed_content_is_refused_before_any_resumed_step(
    tmp_path: Path, changed: dict[str, Any], named: str
) -> None:
    path = save_mid_epoch(tmp_path)
    model = RowModel()
    with pytest.raises(ResumeVerificationError, match=f"rank 0: it has the {named}|rank 0: .*{named}") as raised:
        trainer(tmp_path, [ResumableDataCallback()], max_epochs=2).fit(model, RowsData(**changed), ckpt_path=path)
    assert "epoch 0, global position 6, written on 1 processes" in str(raised.value)
    assert not hasattr(model, "trained_steps"), "a resumed step trained on the wrong batch"


def test_unchanged_content_resumes_and_verification_can_be_turned_off(tmp_path: Path) -> None:
    path = save_mid_epoch(tmp_path)
    model = RowModel()
    trainer(tmp_path, [ResumableDataCallback()], max_epochs=2).fit(model, RowsData(), ckpt_path=path)
    assert model.trained_steps == 16 - 3
    unchecked = ResumableDataCallback(verify=False)
    trainer(tmp_path, [unchecked], max_epochs=2).fit(RowModel(), RowsData(scale=2.0), ckpt_path=path)


def test_the_checkpoint_holds_one_plain_fingerprint_per_rank(tmp_path: Path) -> None:
    state = torch.load(save_mid_epoch(tmp_path), weights_only=True)["callbacks"]["ResumableDataCallback"]["state"]
    [fingerprint] = state["next_batch"]
    assert BatchFingerprint.from_list(fingerprint).to_list() == fingerprint


@pytest.mark.parametrize("raw", [["ab"], ["0" * 16], ["0" * 16, "z" * 16], "0" * 32, [0, 1]])
def test_malformed_fingerprints_are_refused(raw: object) -> None:
    with pytest.raises(StateFormatError, match="fingerprint"):
        BatchFingerprint.from_list(raw)


def test_digests_see_values_dtypes_shapes_and_structure() -> None:
    batch = {"x": torch.arange(6.0).reshape(2, 3), "label": [1, 2], "name": ("a", "b"), "mask": np.ones(2)}
    assert digest_of(batch) == digest_of({**batch, "x": torch.arange(6.0).reshape(2, 3)})
    variants = [
        {**batch, "x": torch.arange(6.0).reshape(3, 2)},
        {**batch, "x": torch.arange(6.0).reshape(2, 3).double()},
        {**batch, "x": torch.arange(6.0).reshape(2, 3) + 1e-7},
        {**batch, "label": [1, 3]},
        {**batch, "label": (1, 2)},
        {**batch, "mask": np.ones(2, dtype=np.float32)},
    ]
    digests = {digest_of(variant) for variant in variants}
    assert len(digests) == len(variants) and digest_of(batch) not in digests


def test_an_element_that_does_not_pickle_is_refused_at_the_save_by_its_own_error() -> None:
    from lightning_resumable import UnfingerprintableBatchError

    with pytest.raises(UnfingerprintableBatchError, match="cannot fingerprint a batch element of type function"):
        digest_of([lambda: None])
