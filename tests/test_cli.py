"""``python -m lightning_resumable inspect``: a checkpoint's data state, readable, as JSON, and clear refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_resumable.format.envelope import StreamState
from lightning_resumable.tools.cli import main, render, summarise

from .helpers import checkpoint_with_callback


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Saved after 3 steps of batch 2 on 1 process, over 16 samples (test_callback's Data)."""
    return checkpoint_with_callback(tmp_path_factory.mktemp("inspect"))


def test_inspect_prints_where_the_stream_stands(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(checkpoint)]) == 0
    out = capsys.readouterr().out
    position, size = 3 * 2, 16
    assert f"{position} of {size} ({100 * position / size:.1f}% of the epoch)" in out
    assert f"epoch 0, {100 * position / size:.0f}% through" in out.splitlines()[0]
    assert "rank 0 next batch" in out and "schema version" in out


def test_inspect_json_holds_the_same_values(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(checkpoint), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    saved = torch.load(checkpoint, weights_only=True)["callbacks"]["ResumableDataCallback"]["state"]
    loader = summary["loaders"]["train"]
    for key, value in saved["train"].items():
        assert loader[key] == value
    assert loader["fraction_through"] == saved["train"]["position"] / saved["train"]["dataset_size"]
    assert loader["next_batch"] == saved["next_batch"]


def test_the_module_and_the_console_script_run(checkpoint: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "lightning_resumable", "inspect", str(checkpoint)], capture_output=True, text=True
    )
    assert done.returncode == 0 and "position (all ranks)" in done.stdout
    script = Path(sys.executable).with_name("lightning-resumable")
    if script.exists():  # installed with the package
        assert subprocess.run([str(script), "inspect", str(checkpoint)], capture_output=True).returncode == 0


def test_a_checkpoint_without_data_state_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "plain.ckpt"
    torch.save({"epoch": 0, "global_step": 3, "state_dict": {}}, path)
    assert main(["inspect", str(path)]) == 1
    assert "holds no data state of lightning-resumable" in capsys.readouterr().err


def test_a_malformed_data_state_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.ckpt"
    torch.save({"callbacks": {"ResumableDataCallback": {"train": {"version": 99}}}}, path)
    assert main(["inspect", str(path)]) == 1
    assert "StateFormatError: data state version 99 is not supported" in capsys.readouterr().err


class Arbitrary:
    pass


def test_a_file_that_needs_unpickling_or_is_missing_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "object.ckpt"
    torch.save({"callbacks": {}, "thing": Arbitrary()}, path)
    assert main(["inspect", str(path)]) == 2
    assert "weights_only=True" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "missing.ckpt")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_a_stream_state_is_summarised_per_rank() -> None:
    ranks = [{"_snapshot": {"rank": rank}} for rank in range(2)]
    state = StreamState(7, 2, 5, 2, 2, False, False, ranks, next_batch=["0123456789abcdef", ""])
    summary = summarise({"stream": state.to_dict()})
    assert summary["place"] == "epoch 2, after 5 batches on each of 2 ranks"
    assert summary["loaders"]["train"]["ranks"] == ranks
    shown = render(Path("x.ckpt"), summary)
    assert "rank 0 next batch" in shown and "0123456789abcdef" in shown
    assert "(not read ahead: not verified)" in shown


def write_log(path: Path, steps: list[tuple[int, int, list[int]]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"epoch": e, "batch": b, "ids": ids}) + "\n" for e, b, ids in steps))


STEPS = [(0, 0, [3, 1]), (0, 1, [0, 2]), (1, 0, [2, 3]), (1, 1, [1, 0])]


def test_compare_finds_identical_runs_with_re_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An interrupted run re-trains the steps after its last checkpoint: the same ids, so identical."""
    for rank in range(2):
        write_log(tmp_path / "full" / f"audit.rank{rank}.jsonl", STEPS)
        write_log(tmp_path / "resumed" / f"audit.rank{rank}.jsonl", [*STEPS[:3], *STEPS[1:]])
    assert main(["compare", str(tmp_path / "full"), str(tmp_path / "resumed")]) == 0
    assert capsys.readouterr().out.startswith(f"identical: {2 * len(STEPS)} steps on 2 rank(s)")


@pytest.mark.parametrize(
    ("other", "message"),
    [
        ([*STEPS[:2], (1, 0, [3, 2]), *STEPS[3:]], "rank 0, epoch 1, batch 0: A read [2, 3], B read [3, 2]"),
        (STEPS[:3], "rank 0, epoch 1, batch 1: trained in A, never in B"),
        ([*STEPS, (0, 1, [2, 0])], "rank 0, epoch 0, batch 1: B trained this step twice with other ids"),
    ],
)
def test_compare_names_the_first_divergence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], other: list[tuple[int, int, list[int]]], message: str
) -> None:
    write_log(tmp_path / "a" / "audit.rank0.jsonl", STEPS)
    write_log(tmp_path / "b" / "audit.rank0.jsonl", other)
    assert main(["compare", str(tmp_path / "a" / "audit.rank0.jsonl"), str(tmp_path / "b")]) == 1
    assert capsys.readouterr().out.startswith(f"different: {message}")


def test_compare_refuses_a_missing_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(tmp_path), str(tmp_path)]) == 2
    assert "no audit file" in capsys.readouterr().err


def mutated(tmp_path: Path, checkpoint: Path, change: Any) -> Path:
    """``checkpoint`` with its data state changed by ``change`` (a function of the state)."""
    loaded = torch.load(checkpoint, weights_only=True)
    change(loaded["callbacks"]["ResumableDataCallback"])
    path = tmp_path / "mutated.ckpt"
    torch.save(loaded, path)
    return path


def test_a_tensor_in_a_datasets_state_keeps_json_valid(
    tmp_path: Path, checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def add_tensor(state: dict[str, Any]) -> None:
        state["state"]["dataset"] = {"weights": torch.arange(3), "seen": torch.zeros(5000)}

    path = mutated(tmp_path, checkpoint, add_tensor)
    assert main(["inspect", str(path), "--json"]) == 0
    dataset = json.loads(capsys.readouterr().out)["loaders"]["train"]["dataset_state"]
    assert dataset == {"weights": [0, 1, 2], "seen": "tensor of shape [5000]"}


@pytest.mark.parametrize(
    "change",
    [
        lambda state: state["state"]["train"].update(epoch=[0]),
        lambda state: state["state"].update(next_batch=[["0"] * 2] * 10**6),
        lambda state: state.update(state=[1, 2]),
        lambda state: state.update({3: "integer key"}),
    ],
    ids=["epoch-list", "million-fingerprints", "state-list", "integer-key"],
)
def test_a_malformed_state_is_a_short_message_and_json_stays_json(
    tmp_path: Path, checkpoint: Path, capsys: pytest.CaptureFixture[str], change: Any
) -> None:
    path = mutated(tmp_path, checkpoint, change)
    assert main(["inspect", str(path)]) == 1
    error = capsys.readouterr().err
    assert error.startswith("lightning-resumable inspect: ") and "Traceback" not in error and len(error) < 2200
    assert main(["inspect", str(path), "--json"]) == 1
    out = capsys.readouterr().out
    assert json.loads(out)["status"] == 1 and len(out) < 2200


def test_compare_refuses_a_step_whose_epoch_is_not_an_integer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "audit.rank0.jsonl").write_text('{"epoch": [0], "batch": 0, "ids": [1]}\n')
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "a")]) == 2
    assert "epoch and batch must be integers" in capsys.readouterr().err
