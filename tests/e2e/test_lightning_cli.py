"""LightningCLI: the callback and its options from YAML (``examples/cli.py``, ``examples/config.yaml``);
a run stopped by ``--trainer.max_steps`` and resumed with ``--ckpt_path`` trains what an uninterrupted
run trains, as its audit log shows (2 DDP processes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from . import processes
from .harness import RUN_TIMEOUT_S

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def cli(folder: Path, *arguments: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(EXAMPLES / "cli.py"), "fit", "--config", str(EXAMPLES / "config.yaml"), *arguments]
    log_path = folder / "fit.log"
    returncode = processes.run_tree(command, log_path, folder, RUN_TIMEOUT_S, "the CLI run")
    assert returncode == 0, log_path.read_text()[-4000:]


def test_a_run_stopped_and_resumed_from_the_cli_trains_what_an_uninterrupted_one_does(tmp_path: Path) -> None:
    cli(tmp_path / "full")
    cli(tmp_path / "interrupted", "--trainer.max_steps", "5")
    checkpoint = tmp_path / "interrupted" / "checkpoints" / "step=5.ckpt"
    assert checkpoint.exists()
    cli(tmp_path / "interrupted", "--ckpt_path", str(checkpoint))
    compare = [sys.executable, "-m", "lightning_resumable", "compare"]
    audits = [str(tmp_path / run / "audit") for run in ("full", "interrupted")]
    done = subprocess.run(compare + audits, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("identical:"), done.stdout + done.stderr
    inspected = subprocess.run([*compare[:3], "inspect", str(checkpoint)], capture_output=True, text=True)
    assert "world size" in inspected.stdout and inspected.returncode == 0


def test_the_callbacks_options_and_their_docs_show_in_help(tmp_path: Path) -> None:
    command = [sys.executable, str(EXAMPLES / "cli.py"), "fit", "--trainer.callbacks.help"]
    done = subprocess.run(
        [*command, "lightning_resumable.ResumableDataCallback"], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 0
    for option in ("allow_world_size_change", "seed_samples", "seed_steps", "verify", "audit_dir"):
        assert f"--trainer.callbacks.{option}" in done.stdout
    assert "resume on a different number of processes" in done.stdout  # the docstring's Args
