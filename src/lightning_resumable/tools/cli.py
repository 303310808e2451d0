"""``python -m lightning_resumable inspect CHECKPOINT [--json]``: the data state a checkpoint holds;
``python -m lightning_resumable compare A B``: whether two runs' audit logs trained the same samples.

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
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from lightning_resumable.errors import MissingStateError, ResumeError
from lightning_resumable.format.envelope import (
    LOADERS,
    STATE,
    STATE_KEY,
    TRAIN,
    LoadersState,
    LoaderState,
    StreamState,
    parse,
)

__all__ = ["main", "summarise"]


class _Unreadable(Exception):
    """The file is not a checkpoint that can be read safely."""


def load_data_state(path: Path) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """The checkpoint (read with ``weights_only=True``) and the raw data state it holds.

    Raises:
        _Unreadable: no such file, or not loadable without unpickling arbitrary objects.
        MissingStateError: the checkpoint holds no data state of this library.
    """
    if not path.is_file():
        raise _Unreadable(f"{path}: no such file")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises UnpicklingError, RuntimeError, EOFError... for what it refuses
        raise _Unreadable(
            f"{path} cannot be read as a checkpoint with torch.load(weights_only=True), which loads no arbitrary"
            f" objects: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        ) from error
    callbacks = checkpoint.get("callbacks") if isinstance(checkpoint, Mapping) else None
    raw = callbacks.get(STATE_KEY) if isinstance(callbacks, Mapping) else None
    if not raw:
        raise MissingStateError(
            f"{path} holds no data state of lightning-resumable: it was written without ResumableDataCallback"
            " (or before the train loader was built)"
        )
    return checkpoint, raw


def _loader_summary(saved: LoaderState, written_version: object) -> dict[str, Any]:
    state = saved.state.to_dict()
    length = saved.state.stream_length
    summary: dict[str, Any] = {"kind": saved.kind, **state}
    summary["version"] = written_version  # as written (an older version is read as the current one)
    if length:
        summary["stream_length"] = length
        summary["fraction_through"] = min(1.0, saved.state.position / length)
    if saved.fingerprints is not None:
        summary["next_batch"] = [fingerprint.to_list() for fingerprint in saved.fingerprints]
    if saved.dataset is not None:
        summary["dataset_state"] = dict(saved.dataset)
    return summary


def _written_versions(raw: Mapping[str, Any]) -> Any:
    """The ``DataState`` versions as written: the body of the envelope, or the state itself before 0.3.0."""
    body = raw.get(STATE, raw)
    if LOADERS in body:
        return {key: loader[TRAIN]["version"] for key, loader in body[LOADERS].items()}
    return body.get(TRAIN, {}).get("version")


def summarise(raw: Mapping[str, Any], checkpoint: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The data state as plain, JSON-ready values: per train loader, and the run's place.

    Raises:
        StateFormatError: the data state is malformed.
        MissingStateError: the checkpoint holds a mark instead of a state, with the reason.
    """
    envelope = parse(raw)
    if envelope.state is None:
        raise MissingStateError(f"the checkpoint holds no resumable data state: {envelope.reason}")
    parsed = envelope.state
    summary: dict[str, Any] = {}
    if envelope.partial_accumulation is not None:
        summary["partial_accumulation"] = asdict(envelope.partial_accumulation)
    if checkpoint is not None:
        summary["checkpoint"] = {key: checkpoint.get(key) for key in ("epoch", "global_step") if key in checkpoint}
    summary.update(_SUMMARIES[parsed.kind](parsed, _written_versions(raw)))  # type: ignore[operator]
    summary["place"] = _PLACES[parsed.kind](list(summary["loaders"].values()))
    return summary


def _stream_summary(parsed: StreamState, versions: Any) -> dict[str, Any]:
    return {
        "loaders": {"train": {"kind": parsed.kind, **parsed.to_dict()}},
        "epoch": parsed.epoch,
        "batches": parsed.batches,
    }


def _several_summary(parsed: LoadersState, versions: Any) -> dict[str, Any]:
    loaders = {key: _loader_summary(parsed.loaders[key], versions[key]) for key in sorted(parsed.loaders)}
    return {
        "mode": parsed.mode,
        "seed": parsed.seed,
        "loaders": loaders,
        "epoch": next(iter(loaders.values()))["epoch"],
    }


def _one_summary(parsed: LoaderState, versions: Any) -> dict[str, Any]:
    return {
        "loaders": {"train": _loader_summary(parsed, versions)},
        "epoch": parsed.state.epoch,
        "batches": parsed.state.batches,
    }


def _stream_place(loaders: list[Mapping[str, Any]]) -> str:
    (stream,) = loaders
    if stream["finished"]:
        return f"epoch {stream['epoch']} complete: the resume starts epoch {stream['epoch'] + 1}"
    return f"epoch {stream['epoch']}, after {stream['batches']} batches on each of {stream['world_size']} ranks"


def _loaders_place(loaders: list[Mapping[str, Any]]) -> str:
    longest = max(loaders, key=lambda loader: loader.get("fraction_through", 0.0))
    if "fraction_through" in longest:
        return f"epoch {longest['epoch']}, {100 * longest['fraction_through']:.0f}% through"
    return f"epoch {longest['epoch']}, after {longest['batches']} batches"


_SUMMARIES = {LoaderState.kind: _one_summary, LoadersState.kind: _several_summary, StreamState.kind: _stream_summary}
_PLACES = {LoaderState.kind: _loaders_place, LoadersState.kind: _loaders_place, StreamState.kind: _stream_place}


def _stream_rows(name: str, loader: Mapping[str, Any]) -> list[tuple[str, str]]:
    rows = [
        (f"{name}: kind", "stream (an IterableDataset with state)"),
        ("schema version", str(loader["version"])),
        ("seed", str(loader["seed"])),
        ("epoch", str(loader["epoch"]) + (" (complete)" if loader["finished"] else "")),
        ("batches completed", f"{loader['batches']} on each rank"),
        ("world size", str(loader["world_size"])),
        ("workers per process", str(loader["num_workers"])),
        ("position is global", str(loader["global_position"])),
        ("written with torchdata", loader["torchdata"] or "(not recorded)"),
    ]
    for rank, state in enumerate(loader["ranks"]):
        rows.append((f"rank {rank} state", json.dumps(state, sort_keys=True, default=str)))
    for rank, digest in enumerate(loader["next_batch"] or []):
        rows.append((f"rank {rank} next batch", digest or "(not read ahead: not verified)"))
    return rows


def _loader_rows(name: str, loader: Mapping[str, Any]) -> list[tuple[str, str]]:
    position = f"{loader['position']:,}"
    if "stream_length" in loader:
        position += f" of {loader['stream_length']:,} ({100 * loader['fraction_through']:.1f}% of the epoch)"
    rows = [
        (f"{name}: kind", "map-style loader" + (f", cycle {loader['cycle']}" if loader["cycle"] else "")),
        ("schema version", str(loader["version"])),
        ("seed", str(loader["seed"])),
        ("epoch", str(loader["epoch"])),
        ("position (all ranks)", position),
        ("batches completed", str(loader["batches"])),
        ("world size", str(loader["world_size"])),
        ("dataset size", f"{loader['dataset_size']:,}"),
        ("draws", str(loader["draws"])),
        ("batch size, shuffle", f"{loader['batch_size']}, {loader['shuffle']}"),
        ("drop_last: sampler, loader", f"{loader['drop_last']}, {loader.get('drop_last_batch', 'not recorded')}"),
    ]
    for rank, (ids, content, *produced) in enumerate(loader.get("next_batch", [])):
        made = f", produced {produced[0]}" if produced and produced[0] else ""
        rows.append((f"rank {rank} next batch", f"ids {ids}, content {content}{made}"))
    if "dataset_state" in loader:
        rows.append(("dataset state", json.dumps(loader["dataset_state"], sort_keys=True, default=str)))
    return rows


_ROWS = {LoaderState.kind: _loader_rows, StreamState.kind: _stream_rows}


def render(path: Path, summary: Mapping[str, Any]) -> str:
    lines = [f"{path}: {summary['place']}"]
    where = summary.get("checkpoint", {})
    if where:
        lines.append("  Lightning: " + ", ".join(f"{key} {value}" for key, value in where.items()))
    if "mode" in summary:
        lines.append(f"  several train loaders, CombinedLoader mode {summary['mode']}, run seed {summary['seed']}")
    if "partial_accumulation" in summary:
        partial = summary["partial_accumulation"]
        lines.append(
            f"  saved inside a gradient accumulation window ({partial['accumulated']} of {partial['window']} batches"
            " accumulated): a resume is refused with PartialAccumulationError"
        )
    rows = [row for name, loader in summary["loaders"].items() for row in _ROWS[loader["kind"]](name, loader)]
    width = max(len(label) for label, _ in rows)
    lines += [f"  {label:<{width}}  {value}" for label, value in rows]
    return "\n".join(lines)


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
    arguments = parser.parse_args(argv)
    return _inspect(arguments) if arguments.command == "inspect" else _compare(arguments)
