"""Audit logs: per rank, the sample ids of every trained step, and the comparison of two runs.

Promise: with ``ResumableDataCallback(audit_dir=...)`` every rank appends one JSON line per trained
step to ``audit.rank{R}.jsonl`` (``{"epoch", "batch", "ids"}``, and a mixture's ``"weights"`` the step
was drawn under; flushed at once, so a killed run keeps
every line it wrote). A resumed run appends to the same files, re-runs of steps after the last
checkpoint included. `first_divergence` then tells whether two runs (an interrupted one and an
uninterrupted one, say) trained the same samples at every step, on every rank.

``ids`` are dataset indices for a map-style loader, ``{key: ids}`` for several loaders (``None``
for one that is exhausted in ``max_size`` mode) and, for a stream, whose samples have no index, a
16-hex-digit digest of the batch's content.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

__all__ = ["AuditLog", "first_divergence", "read_audit"]

_RANK_IN_NAME = re.compile(r"audit\.rank(\d+)\.jsonl$")
Steps = dict[int, list[dict[str, Any]]]
"""Per rank, the logged steps in the order they were trained."""


class AuditLog:
    """One rank's audit file, appended to; each line flushed when written.

    A kill can cut the last line short. Before appending, that line is ended, so the next record
    starts a line of its own (`read_audit` skips the cut one, and says so).
    """

    def __init__(self, directory: str | Path, rank: int) -> None:
        self.path = Path(directory) / f"audit.rank{rank}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = self.path.open("a", encoding="utf-8")
        if self._file.tell() > 0 and not self.path.read_bytes().endswith(b"\n"):
            warnings.warn(
                f"lightning_resumable: the last line of {self.path} was cut short (a kill while it was written);"
                " it is ended here, and compare skips it",
                RuntimeWarning,
                stacklevel=2,
            )
            self._file.write("\n")
            self._file.flush()

    def write(
        self, epoch: int, batch: int, ids: Any, weights: Mapping[str, str] | None = None, skipped: Any = None
    ) -> None:
        """One trained step; a mixture's also with the weights its samples were drawn under (``"3/10"``); the
        first step after skipped steps with the skip (``{"steps": "a-b", "holes": [...]}``)."""
        record = {"epoch": epoch, "batch": batch, "ids": ids, **({"weights": dict(weights)} if weights else {})}
        if skipped is not None:
            record["skipped"] = skipped
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_audit(path: str | Path) -> Steps:
    """The steps of an audit file, or of a directory of per-rank audit files.

    Raises:
        ValueError: no audit file there, or a line that is not a logged step.
    """
    path = Path(path)
    files = sorted(path.glob("audit.rank*.jsonl")) if path.is_dir() else [path]
    if not files or not all(file.is_file() for file in files):
        raise ValueError(f"{path}: no audit file (audit.rank<R>.jsonl)")
    steps: Steps = {}
    for file in files:
        found = _RANK_IN_NAME.search(file.name)
        rank = int(found.group(1)) if found else 0
        records = []
        for number, line in enumerate(file.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
            try:
                records.append(_record(json.loads(line), f"{file}:{number}", line))
                continue
            except json.JSONDecodeError:
                pass
            # A line cut short by a kill; before AuditLog ended such lines, the record written after the
            # resume followed it on the same line: keep that one.
            cut = line.rfind('{"epoch"')
            if not line.startswith('{"epoch"') and cut <= 0:
                raise ValueError(f"{file}:{number}: not JSON: {line[:200]}")
            warnings.warn(f"{file}:{number}: a step cut short by a kill is skipped", RuntimeWarning, stacklevel=2)
            if cut > 0:
                try:
                    records.append(_record(json.loads(line[cut:]), f"{file}:{number}", line))
                except json.JSONDecodeError:
                    raise ValueError(f"{file}:{number}: not JSON: {line[:200]}") from None
        steps[rank] = records
    return steps


def _record(value: object, where: str, line: str) -> dict[str, Any]:
    """``value`` as a logged step: integer epoch and batch, and ids.

    Raises:
        ValueError: it is not one.
    """
    if not isinstance(value, Mapping) or not {"epoch", "batch", "ids"} <= set(value):
        raise ValueError(f"{where}: not a logged step: {line[:200]}")
    if any(type(value[key]) is not int for key in ("epoch", "batch")):
        raise ValueError(f"{where}: a logged step's epoch and batch must be integers: {line[:200]}")
    return dict(value)


def _by_step(rank: int, records: list[dict[str, Any]], name: str) -> tuple[dict[tuple[int, int], Any], str | None]:
    """Each step's ids, and a message if a re-run of a step read other ids than its first run."""
    ids: dict[tuple[int, int], Any] = {}
    for record in records:
        step = (record["epoch"], record["batch"])
        if "skipped" in record:  # a run rolled back and skipped data here: its steps from here on are new ones
            ids = {earlier: read for earlier, read in ids.items() if earlier < step}
        read = record["ids"] if "weights" not in record else {"ids": record["ids"], "weights": record["weights"]}
        if step in ids and ids[step] != read:
            return ids, (
                f"rank {rank}, epoch {step[0]}, batch {step[1]}: {name} trained this step twice with other ids"
                f" ({ids[step]} then {read})"
            )
        ids.setdefault(step, read)
    return ids, None


def first_divergence(a: Steps, b: Steps) -> str | None:
    """``None`` if both runs trained the same steps with the same ids on every rank (re-runs included),
    else where they first differ: rank, epoch, batch and the ids on each side."""
    if set(a) != set(b):
        return f"the runs logged other ranks: A {sorted(a)}, B {sorted(b)}"
    for rank in sorted(a):
        a_ids, problem = _by_step(rank, a[rank], "A")
        if problem:
            return problem
        b_ids, problem = _by_step(rank, b[rank], "B")
        if problem:
            return problem
        for step, ids in a_ids.items():
            if step not in b_ids:
                return f"rank {rank}, epoch {step[0]}, batch {step[1]}: trained in A, never in B"
            if b_ids[step] != ids:
                return f"rank {rank}, epoch {step[0]}, batch {step[1]}: A read {ids}, B read {b_ids[step]}"
        extra = [step for step in b_ids if step not in a_ids]
        if extra:
            return f"rank {rank}, epoch {extra[0][0]}, batch {extra[0][1]}: trained in B, never in A"
    return None
