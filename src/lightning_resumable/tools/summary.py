"""What ``inspect`` shows of a checkpoint's data state: per train loader, plain JSON-ready values
(`summarise`) and the rows a reader sees (`render`), one summary and one set of rows per kind."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from lightning_resumable.core.mixture_stream import Segment
from lightning_resumable.errors import MissingStateError
from lightning_resumable.format.envelope import (
    LOADERS,
    STATE,
    TRAIN,
    LoadersState,
    LoaderState,
    MixtureState,
    StreamState,
    parse,
)

__all__ = ["render", "summarise"]


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
    if envelope.skips:
        summary["skips"] = [skip.to_dict() for skip in envelope.skips]
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


def _mixture_summary(parsed: MixtureState, versions: Any) -> dict[str, Any]:
    """The loader's summary, and where each source stands at the save: weight, pass, place in the pass."""
    record, position = parsed.mixture, parsed.position
    segment = Segment(
        record.segment_start, record.period, tuple(sorted(record.parts.items())), tuple(sorted(record.counts.items()))
    )
    sources = {}
    for name, count in sorted(segment.counts_at(position).items()):
        size, part = record.sizes[name], record.parts.get(name, 0)
        sources[name] = {
            "weight": part / record.period,
            "parts": f"{part}/{record.period}",
            "size": size,
            "drawn": count,
            "pass": count // size,
            "position": count % size,
            **({"chunks": record.chunks[name]} if name in record.chunks else {}),
        }
    summary = _one_summary(parsed.loader, versions)
    summary["loaders"]["train"].update(
        kind=parsed.kind,
        stream_position=position,
        epoch_start=record.epoch_start,
        steps=record.steps,
        weights_since=record.segment_start,
        sources=sources,
    )
    if record.changes:  # the weights the training set: each change, and whether it is in force, past or pending
        summary["loaders"]["train"]["weight_changes"] = [
            {**change.to_dict(), "pending": change.position > position} for change in record.changes
        ]
    return summary


_SUMMARIES = {
    LoaderState.kind: _one_summary,
    LoadersState.kind: _several_summary,
    StreamState.kind: _stream_summary,
    MixtureState.kind: _mixture_summary,
}
_PLACES = {
    LoaderState.kind: _loaders_place,
    LoadersState.kind: _loaders_place,
    StreamState.kind: _stream_place,
    MixtureState.kind: _loaders_place,
}


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


def _mixture_rows(name: str, loader: Mapping[str, Any]) -> list[tuple[str, str]]:
    shown: dict[str, str | None] = {
        "dataset size": "samples per epoch",
        "draws": None,
        "drop_last: sampler, loader": None,
    }
    rows = [(f"{name}: kind", "a mixture of sources")]
    for label, value in _loader_rows(name, loader)[1:]:
        shown_as = shown.get(label, label)
        if shown_as is not None:
            rows.append((shown_as, value))
    rows += [
        ("stream position", f"{loader['stream_position']:,} (the epoch began at {loader['epoch_start']:,})"),
        ("steps trained", f"{loader['steps']:,}"),
        ("weights in force since", f"stream position {loader['weights_since']:,}"),
    ]
    for source, where in loader["sources"].items():
        weight = f"weight {where['weight']:.4g} ({where['parts']})" if where["weight"] else "not drawn (weight 0)"
        read = f"{weight}, pass {where['pass']}, {where['position']:,} of {where['size']:,} read"
        chunked = f"; chunk by chunk (chunks x window: {where['chunks']})" if "chunks" in where else ""
        rows.append((f"source {source!r}", read + chunked))
    changes = loader.get("weight_changes", [])
    if changes:
        rows.append(("weights set by the training", f"{len(changes)} changes (asked at step -> drawn from step)"))
    for number, change in enumerate(changes, start=1):
        parts, period = change["weights"]["parts"], change["weights"]["period"]
        weights = ", ".join(f"{name} {part / period:.4g}" for name, part in sorted(parts.items()))
        pending = " (pending: asked before the save, drawn from after it)" if change["pending"] else ""
        rows.append((f"  change {number}", f"step {change['asked']} -> {change['step']}: {weights}{pending}"))
    return rows


_ROWS = {LoaderState.kind: _loader_rows, StreamState.kind: _stream_rows, MixtureState.kind: _mixture_rows}


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
    for skip in summary.get("skips", []):
        first, last = skip["steps"]
        positions = sum(hole[2] for hole in skip["holes"])
        lines.append(
            f"  skipped steps {first}-{last}: their data ({positions:,} positions) passed over at step {skip['at']}"
        )
    rows = [row for name, loader in summary["loaders"].items() for row in _ROWS[loader["kind"]](name, loader)]
    width = max(len(label) for label, _ in rows)
    lines += [f"  {label:<{width}}  {value}" for label, value in rows]
    return "\n".join(lines)
