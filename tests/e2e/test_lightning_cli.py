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


def test_skipped_steps_from_yaml_roll_back_to_the_run_given_them_from_the_start(tmp_path: Path) -> None:
    """``skip_steps`` in the callback's ``init_args``: a run stopped at step 5 and resumed with the skip trains what
    a run given it from the start trains (the audit logs compare identical), and the config may keep it."""
    text = (EXAMPLES / "config.yaml").read_text()
    skipping = tmp_path / "skipping.yaml"
    skipping.write_text(
        text.replace("        audit_dir: audit", '        audit_dir: audit\n        skip_steps: ["7-9"]')
    )
    cli(tmp_path / "reference", "--config", str(skipping))
    cli(tmp_path / "recovered", "--trainer.max_steps", "5")
    cli(
        tmp_path / "recovered",
        "--config",
        str(skipping),
        "--ckpt_path",
        str(tmp_path / "recovered/checkpoints/step=5.ckpt"),
    )
    audits = [str(tmp_path / run / "audit") for run in ("reference", "recovered")]
    done = subprocess.run(
        [sys.executable, "-m", "lightning_resumable", "compare", *audits], capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.startswith("identical:"), done.stdout + done.stderr
    # A later resume of the recovered run, its config unchanged, keeps the skip and does not refuse it.
    later = sorted((tmp_path / "recovered" / "checkpoints").glob("step=1*.ckpt"))[0]
    cli(tmp_path / "later", "--config", str(skipping), "--ckpt_path", str(later))
