"""``python -m lightning_resumable inspect CHECKPOINT [--json]``: the data state a checkpoint holds;
``python -m lightning_resumable compare A B``: whether two runs' audit logs trained the same samples;
``python -m lightning_resumable batches CHECKPOINT --steps A-B``: the samples of steps (`tools.step_batches`).

It reads the checkpoint with ``torch.load(weights_only=True)``, so it never unpickles arbitrary
objects, and prints per train loader where its stream stands (seed, epoch, position, the setup that
wrote it, the next-batch fingerprints) and its place in the run ("epoch 3, 41% through"). A
checkpoint without data state, or with a malformed one, is reported and the exit status is 1; a file
that cannot be read is status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from lightning_resumable.errors import ResumeError
from lightning_resumable.tools.checkpoint_file import Unreadable as _Unreadable
from lightning_resumable.tools.checkpoint_file import load_data_state
from lightning_resumable.tools.summary import render, summarise

__all__ = ["main", "render", "summarise"]


def _plain(value: object) -> object:
    """A JSON value for what a dataset's own state may hold beyond JSON (a tensor, an array, a set)."""
    if isinstance(value, torch.Tensor):
        return value.tolist() if value.numel() <= 1000 else f"tensor of shape {list(value.shape)}"
    tolist = getattr(value, "tolist", None)  # a NumPy array or scalar
    if callable(tolist):
        return tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return repr(value)[:200]


def _inspect(arguments: argparse.Namespace) -> int:
    path = Path(arguments.checkpoint)
    try:
        checkpoint, raw = load_data_state(path)
        summary = summarise(raw, checkpoint)
        if arguments.json:
            text = json.dumps(summary, indent=2, sort_keys=True, default=_plain)
        else:
            text = render(path, summary)
    except _Unreadable as error:
        return _refuse(arguments, 2, str(error))
    except ResumeError as error:
        return _refuse(arguments, 1, f"{type(error).__name__}: {error}")
    except Exception as error:  # a state this version cannot summarise: still a message, never a traceback
        return _refuse(arguments, 1, f"the data state cannot be summarised: {type(error).__name__}: {error}")
    print(text)
    return 0


def _refuse(arguments: argparse.Namespace, status: int, message: str) -> int:
    """Report why ``inspect`` cannot show a checkpoint: on stderr, and with ``--json`` as JSON on stdout."""
    if len(message) > 2000:
        message = message[:2000] + "..."
    print(f"lightning-resumable inspect: {message}", file=sys.stderr)
    if arguments.json:
        print(json.dumps({"error": message, "status": status}))
    return status


def _compare(arguments: argparse.Namespace) -> int:
    from lightning_resumable.format.audit import first_divergence, read_audit

    try:
        a, b = read_audit(arguments.a), read_audit(arguments.b)
    except (ValueError, OSError) as error:
        print(f"lightning-resumable compare: {str(error)[:2000]}", file=sys.stderr)
        return 2
    divergence = first_divergence(a, b)
    if divergence is None:
        steps = sum(len({(r["epoch"], r["batch"]) for r in records}) for records in a.values())
        print(f"identical: {steps} steps on {len(a)} rank(s) read the same samples")
        return 0
    print(f"different: {divergence}")
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: ``inspect`` a checkpoint, ``compare`` two audit logs; returns the exit status."""
    parser = argparse.ArgumentParser(prog="lightning-resumable", description="Tools for lightning-resumable's state.")
    commands = parser.add_subparsers(dest="command", required=True)
    inspect = commands.add_parser("inspect", help="print the data state a Lightning checkpoint holds")
    inspect.add_argument("checkpoint", help="a .ckpt file written with ResumableDataCallback")
    inspect.add_argument("--json", action="store_true", help="print it as JSON, for tools")
    compare = commands.add_parser(
        "compare", help="compare two audit logs (ResumableDataCallback(audit_dir=...)): identical, or where they differ"
    )
    compare.add_argument("a", help="an audit file, or a directory of audit.rank<R>.jsonl files")
    compare.add_argument("b", help="the other run's")
    batches = commands.add_parser(
        "batches", help="the sample ids each rank read (before the checkpoint) or will read (after it) at steps"
    )
    batches.add_argument("checkpoint", help="a .ckpt file written with ResumableDataCallback")
    batches.add_argument("--steps", required=True, help="steps as the run numbered them: 40700-40900, or a-b,c-d")
    batches.add_argument("--rank", type=int, action="append", help="this rank only (repeatable); all by default")
    batches.add_argument("--accumulate", type=int, default=1, help="the run's accumulate_grad_batches (default 1)")
    batches.add_argument("--json", action="store_true", help="one JSON object per step and rank")
    arguments = parser.parse_args(argv)
    if arguments.command == "batches":
        return _batches(arguments)
    return _inspect(arguments) if arguments.command == "inspect" else _compare(arguments)


def _batches(arguments: argparse.Namespace) -> int:
    from lightning_resumable.tools.step_batches import step_batches

    try:
        path, accumulate = Path(arguments.checkpoint), arguments.accumulate
        listed = step_batches(path, arguments.steps, ranks=arguments.rank, accumulate_grad_batches=accumulate)
    except _Unreadable as error:
        print(f"lightning-resumable batches: {error}", file=sys.stderr)
        return 2
    except ResumeError as error:
        print(f"lightning-resumable batches: {type(error).__name__}: {str(error)[:2000]}", file=sys.stderr)
        return 1
    for entry in listed:
        if arguments.json:
            print(json.dumps(entry.to_dict()))
        else:
            when = "read" if entry.trained else "will read"
            where = f"epoch {entry.epoch}, batch {entry.batches[0] if entry.batches else '-'}"
            print(f"step {entry.step} rank {entry.rank} ({where}) {when}: {entry.samples}")
    return 0
