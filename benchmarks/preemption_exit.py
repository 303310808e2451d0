"""From a preemption signal to the last process of the run gone: the time a job needs after its SIGTERM.

``python benchmarks/preemption_exit.py [SEEDS]`` runs that many fresh seeds of the preemption matrix
(`tests/e2e/test_preemption_matrix.py`: 2 processes mostly, gloo on CPU, 0 or 2 workers, every signal,
target and moment it draws), each run's seconds from the signal to the last process gone appended to a
file, then prints their median and maximum, overall and by the moment the signal came. ``--times FILE``
only summarises a file an earlier run (``E2E_PREEMPTION_TIMES=FILE``) wrote. The matrix's runs are forked
from the suite's fork server and end as Python's exit does, without its last module teardown;
``python examples/preemption.py --runs 20`` measures whole ``python train.py`` processes (Lightning's
launcher), which print the same figures.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


LAUNCHERS = {"fork": "the suite's fork server", "lightning": "Lightning's launcher", "torchrun": "torchrun"}


def summary(times: Path) -> list[str]:
    """Tables of the median and maximum seconds, by the launch and by the moment the signal came."""
    cases = [json.loads(line) for line in times.read_text().splitlines()]
    by_launch: dict[str, list[float]] = collections.defaultdict(list)
    by_when: dict[str, list[float]] = collections.defaultdict(list)
    for case in cases:  # a case reads "SIGTERM-to-group-batch@1.2-...-fork"
        by_launch[LAUNCHERS[case["case"].rsplit("-", 1)[1]]].append(case["exit_s"])
        by_when[case["case"].split("-to-", 1)[1].split("-", 1)[1].split("@", 1)[0]].append(case["exit_s"])
    rows: list[str] = []
    for title, groups in (("launched by", by_launch), ("the signal came", by_when)):
        rows += ["", f"| {title} | runs | median | max |", "|---|---:|---:|---:|"]
        for name, seconds in sorted(groups.items()):
            rows.append(f"| {name} | {len(seconds)} | {statistics.median(seconds):.2f} s | {max(seconds):.2f} s |")
    every = [case["exit_s"] for case in cases]
    rows.append(f"| **all** | {len(every)} | {statistics.median(every):.2f} s | {max(every):.2f} s |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("seeds", nargs="?", type=int, default=100, help="fresh seeds of the matrix to run")
    parser.add_argument("--times", type=Path, help="summarise this file instead of running the matrix")
    args = parser.parse_args()
    times = args.times
    if times is None:
        times = Path(tempfile.mkdtemp(prefix="preemption_exit_")) / "times.jsonl"
        env = {**os.environ, "E2E_MATRIX_SOAK": str(args.seeds), "E2E_PREEMPTION_TIMES": str(times)}
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "e2e"]
        command += ["tests/e2e/test_preemption_matrix.py", "-k", "drawn_preemption_ends"]
        done = subprocess.run(command, cwd=ROOT, env=env, check=False)
        print(f"the matrix exited {done.returncode}; times in {times}")
    print("\n".join(summary(times)))


if __name__ == "__main__":
    main()
