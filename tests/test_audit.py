"""The audit log records, per rank and step, the ids each step really trained; a resumed run's log
compares identical to an uninterrupted run's, and a wrong one does not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from lightning_resumable import ResumableDataCallback
from lightning_resumable.format.audit import first_divergence, read_audit

from .helpers import Data, SaveAtStep, Several, trainer


class Recording(L.LightningModule):
    """Records the values of each batch: the datasets here hold their own index as their value."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[Any] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        parts = batch if isinstance(batch, dict) else {"": batch}
        ids = {key: None if part is None else part[0].flatten().long().tolist() for key, part in parts.items()}
        self.seen.append(ids.get("", ids))
        return sum(self.layer(part[0]).mean() for part in parts.values() if part is not None)  # type: ignore[return-value]

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def audited(tmp_path: Path, name: str, data: L.LightningDataModule, *extra: L.Callback, **kwargs: Any) -> Recording:
    model = Recording()
    callbacks = [ResumableDataCallback(audit_dir=str(tmp_path / name)), *extra]
    trainer(tmp_path, callbacks, max_epochs=2).fit(model, data, **kwargs)
    return model


def test_the_audit_log_holds_the_ids_each_step_trained(tmp_path: Path) -> None:
    model = audited(tmp_path, "run", Data())
    logged = [json.loads(line) for line in (tmp_path / "run" / "audit.rank0.jsonl").read_text().splitlines()]
    assert [record["ids"] for record in logged] == model.seen
    assert [(r["epoch"], r["batch"]) for r in logged] == [(e, b) for e in range(2) for b in range(8)]


def test_several_loaders_are_logged_by_key(tmp_path: Path) -> None:
    L.seed_everything(3)
    model = audited(tmp_path, "run", Several(mode="max_size"))
    logged = [json.loads(line)["ids"] for line in (tmp_path / "run" / "audit.rank0.jsonl").read_text().splitlines()]
    indices = [{key: ids and [i % 100 for i in ids] for key, ids in step.items()} for step in model.seen]
    assert logged == indices  # dataset indices: b's values are its indices + 100
    assert any(ids["b"] is None for ids in logged), "the short loader is exhausted in max_size mode"


def test_an_interrupted_run_compares_identical_and_a_differently_seeded_one_does_not(tmp_path: Path) -> None:
    L.seed_everything(5)
    audited(tmp_path, "full", Data())
    path = tmp_path / "mid.ckpt"
    audited(tmp_path, "interrupted", Data(), SaveAtStep(3, path))  # trains on: steps after 3 run twice
    audited(tmp_path, "interrupted", Data(), ckpt_path=path)
    assert first_divergence(read_audit(tmp_path / "full"), read_audit(tmp_path / "interrupted")) is None
    L.seed_everything(6)
    audited(tmp_path, "other", Data())
    assert "epoch 0, batch 0: A read" in str(
        first_divergence(read_audit(tmp_path / "full"), read_audit(tmp_path / "other"))
    )


def test_a_line_cut_by_a_kill_is_ended_before_the_next_record_and_no_record_is_dropped(tmp_path: Path) -> None:
    """A kill cut the last line; the resumed run appended to it. compare then failed with "not JSON", or,
    when the cut line was the last, dropped the resumed step silently."""
    from lightning_resumable.format.audit import AuditLog

    first = AuditLog(tmp_path, 0)
    first.write(0, 0, [1, 2])
    first.close()
    path = tmp_path / "audit.rank0.jsonl"
    path.write_text(path.read_text() + '{"epoch": 0, "batch": 1, "id')  # the kill
    with pytest.warns(RuntimeWarning, match="cut short"):
        resumed = AuditLog(tmp_path, 0)
    resumed.write(0, 1, [3, 4])
    resumed.close()
    with pytest.warns(RuntimeWarning, match="rank0.jsonl:2: a step cut short by a kill is skipped"):
        steps = read_audit(tmp_path)
    assert [(step["batch"], step["ids"]) for step in steps[0]] == [(0, [1, 2]), (1, [3, 4])]


def test_a_log_written_before_the_repair_keeps_the_record_that_follows_a_cut_line(tmp_path: Path) -> None:
    path = tmp_path / "audit.rank0.jsonl"
    path.write_text('{"epoch": 0, "batch": 0, "ids": [1]}\n{"epoch": 0, "ba{"epoch": 0, "batch": 1, "ids": [2]}\n')
    with pytest.warns(RuntimeWarning, match="cut short"):
        steps = read_audit(path)
    assert [step["ids"] for step in steps[0]] == [[1], [2]]


@pytest.mark.parametrize(
    "line", ['{"epoch": [0], "batch": 0, "ids": []}', '{"epoch": true, "batch": 0, "ids": []}', "[1, 2]", "garbage"]
)
def test_a_line_that_is_no_logged_step_is_refused_by_its_place(tmp_path: Path, line: str) -> None:
    path = tmp_path / "audit.rank0.jsonl"
    path.write_text('{"epoch": 0, "batch": 0, "ids": [1]}\n' + line + "\n")
    with pytest.raises(ValueError, match=r"audit\.rank0\.jsonl:2: "):
        read_audit(path)
