"""Checkpoints written by earlier releases keep resuming to the batches those releases would have trained.

Each ``tests/fixtures/<version>/`` holds checkpoints a release wrote mid-run and, in ``expected.json``,
the steps that release's uninterrupted run trained after them (see ``tests/release_fixtures.py``). They
are never regenerated: a new release adds its own directory. A change to the persisted schema, the
sample order or the sample seeds that breaks an old checkpoint fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_resumable import IncompatibleStateError
from lightning_resumable.format.envelope import StreamState, parse
from lightning_resumable.internals._torchdata import torchdata_release, torchdata_version
from lightning_resumable.tools.cli import main as cli_main

from .release_fixtures import FIXTURES, ids_of, run

RELEASES = sorted(path for path in FIXTURES.iterdir() if (path / "expected.json").is_file())
CASES = [
    pytest.param(release, scenario, id=f"{release.name}-{scenario}")
    for release in RELEASES
    for scenario in json.loads((release / "expected.json").read_text())["scenarios"]
]


def expected(release: Path, scenario: str) -> dict[str, Any]:
    return json.loads((release / "expected.json").read_text())["scenarios"][scenario]  # type: ignore[no-any-return]


def test_every_release_has_fixtures() -> None:
    assert [release.name for release in RELEASES][:2] == ["0.1.0", "0.2.0"]
    assert len(CASES) >= 5


def data_state(path: Path) -> dict[str, Any]:
    checkpoint = torch.load(path, weights_only=True)
    (state,) = (value for key, value in checkpoint["callbacks"].items() if "ResumableDataCallback" in key)
    return state  # type: ignore[no-any-return]


def newer_torchdata(path: Path) -> str | None:
    """The torchdata version that wrote a stream checkpoint, if newer than the installed one."""
    body = parse(data_state(path)).state  # any release's form (0.3.0 writes an envelope)
    written = body.torchdata if isinstance(body, StreamState) else ""
    return written if written and torchdata_release(written) > torchdata_release(torchdata_version()) else None


@pytest.mark.parametrize(("release", "scenario"), CASES)
def test_a_release_checkpoint_resumes_to_that_releases_batches(tmp_path: Path, release: Path, scenario: str) -> None:
    written_by = newer_torchdata(release / f"{scenario}.ckpt")
    if written_by:  # the oldest-versions CI run: torchdata 0.10 cannot read 0.11's loader state, so it is refused
        with pytest.raises(IncompatibleStateError, match=f"written with torchdata {written_by} and resumes with"):
            run(scenario, tmp_path, ckpt_path=release / f"{scenario}.ckpt")
        return
    steps = run(scenario, tmp_path, ckpt_path=release / f"{scenario}.ckpt")
    if not json.loads((release / "expected.json").read_text())["content"]:  # a release that did not seed samples
        steps = [ids_of(step) for step in steps]
    assert steps == expected(release, scenario)["steps_after"]


@pytest.mark.parametrize(("release", "scenario"), CASES)
def test_a_release_checkpoint_loads_without_unpickling_and_inspects(
    release: Path, scenario: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert data_state(release / f"{scenario}.ckpt")  # the data state is there, in plain values
    assert cli_main(["inspect", str(release / f"{scenario}.ckpt")]) == 0
    assert f"global_step {expected(release, scenario)['stop_step']}\n" in capsys.readouterr().out


def test_inspect_shows_the_schema_version_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["inspect", str(FIXTURES / "0.1.0" / "shuffle.ckpt")]) == 0
    assert re.search(r"schema version +1\n", capsys.readouterr().out)
