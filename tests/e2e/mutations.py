"""Mutations the workflow matrix must catch: each is applied to a copy of the package, the matrix runs on
it, and the seeds that failed are printed (a mutation no seed catches is a hole in the matrix).

    python tests/e2e/mutations.py                 # every mutation, the CI seeds
    python tests/e2e/mutations.py --seeds 1,9 off_by_one

Run by hand (minutes each); the closing note of issue 35 lists what it printed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "lightning_resumable"

MUTATIONS: dict[str, tuple[str, str, str]] = {
    # name: (module, text, replacement)
    "off_by_one": (
        "core/sampler.py",
        "self._origin_position, self._origin_batches = saved.position, saved.batches",
        "self._origin_position, self._origin_batches = saved.position + 1, saved.batches",
    ),
    "save_draws": (
        "lightning/callback.py",
        "        batches = self._batches.of(trainer.current_epoch, batches_processed(trainer))\n"
        "        if self._captured is not None",
        "        random.random(), __import__('torch').rand(())\n"
        "        batches = self._batches.of(trainer.current_epoch, batches_processed(trainer))\n"
        "        if self._captured is not None",
    ),
    "validation_skipped": (
        "internals/_loop_progress.py",
        "        return\n    epoch_loop = trainer.fit_loop.epoch_loop",
        "        return\n    return\n    epoch_loop = trainer.fit_loop.epoch_loop",
    ),
    "epoch_end_as_next_start": (
        "lightning/mixture_owner.py",
        "epoch_start = self.sampler.epoch_start(state.epoch)",
        "epoch_start = self.sampler.epoch_start(self.sampler.epoch)",
    ),
    "sources_by_position": (
        "core/verification.py",
        "    if not isinstance(dataset, Mixture):\n        return keys",
        "    if True:\n        return keys",
    ),
}


def mutated_package(name: str, into: Path) -> Path:
    module, text, replacement = MUTATIONS[name]
    copy = into / "src" / "lightning_resumable"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    path = copy / module
    source = path.read_text()
    if source.count(text) != 1:
        raise SystemExit(f"mutation {name}: the text to replace is in {module} {source.count(text)} times, not once")
    path.write_text(source.replace(text, replacement))
    return copy.parent


def caught_by(name: str, seeds: str) -> list[str]:
    with tempfile.TemporaryDirectory(prefix=f"mutant-{name}-") as scratch:
        src = mutated_package(name, Path(scratch))
        env = {**os.environ, "PYTHONPATH": str(src), "E2E_MATRIX_SEEDS": seeds, "PYTHONDONTWRITEBYTECODE": "1"}
        command = [sys.executable, "-m", "pytest", "-q", "-m", "e2e", "-p", "no:cacheprovider", "-k", "drawn"]
        command += [str(ROOT / "tests" / "e2e" / "test_workflow_matrix.py"), "--basetemp", str(Path(scratch) / "runs")]
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    failed = re.findall(r"^FAILED \S+::(test_\w+)\[(\d+)\]", done.stdout, re.MULTILINE)
    return [f"{seed} ({'chain' if 'several' in test else 'case'})" for test, seed in failed]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help=f"mutations to run (default: all of {', '.join(MUTATIONS)})")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default: the matrix's CI seeds)")
    arguments = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests.e2e.chains import CASE_SEEDS, CHAIN_SEEDS, CI_SEEDS

    seeds = arguments.seeds or ",".join(str(seed) for seed in (*CI_SEEDS, *CASE_SEEDS, *CHAIN_SEEDS))
    unknown = set(arguments.names) - set(MUTATIONS)
    if unknown:
        parser.error(f"no mutation {sorted(unknown)}; known: {list(MUTATIONS)}")
    for name in arguments.names or list(MUTATIONS):
        caught = caught_by(name, seeds)
        print(f"{name:26} caught by {', '.join(caught) if caught else 'NO SEED'}", flush=True)


if __name__ == "__main__":
    main()
