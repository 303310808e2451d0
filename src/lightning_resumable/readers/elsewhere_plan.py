"""Where a stream's epoch resumes on another layout: the plan read from a checkpoint's worker states (issue 55;
`lightning_resumable.readers.stream_elsewhere` reads it).

Promise: `resume_plan` takes, from every worker's saved stream state, the first layout's place in the epoch's global
sequence (each first-layout worker's stream at its saved place, at the checkpoint's count of batches), or, inside an
epoch already going on elsewhere, the place of the worker that read the last batch trained (the one at the
checkpoint's global position); `sequence_from_state` opens the `GlobalSequence` at a plan's place, refusing a
malformed one; `fresh_plan` is an epoch begun on one layout and read in another's order from its start (a stream that
declares its order: `declared_order`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from lightning_resumable.errors import IncompatibleStateError, StateFormatError, UnsupportedLoaderError
from lightning_resumable.format.stream_state import STREAM_ORDER_ATTRIBUTE
from lightning_resumable.readers.recording import FRESH_PASS
from lightning_resumable.readers.stream_elsewhere import (
    STREAM_ELSEWHERE,
    GlobalSequence,
    Layout,
    Partition,
    Partitions,
)

__all__ = ["DROPS_LAST", "declared_order", "fresh_plan", "resume_plan", "sequence_from_state"]

DROPS_LAST = (
    "the loader drops each worker's last partial batch (drop_last=True), which another layout's workers would not"
    " drop where this one's did"
)


def resume_plan(
    states: Sequence[Mapping[str, Any]], source: Partitions, first: Layout, epoch: int, batches: int, layout: Layout
) -> dict[str, Any]:
    """The place to resume at, as a stream state's `STREAM_ELSEWHERE` entry, from the stream states of every worker
    of every rank of a checkpoint written after ``batches`` batches of ``epoch`` (rank after rank, worker after
    worker; each ``{"stream": ..., "yielded": items}``).

    Each is either the first layout's own (its place read by ``source``) or, inside an epoch already going on on
    another layout, a `GlobalSequence`'s: then the one at the checkpoint's global position (the worker that read the
    last batch trained) is taken.

    Raises:
        StateFormatError: no state is at the checkpoint's position, or one is malformed.
        IncompatibleStateError: a worker's state cannot go on elsewhere (``source.refusal``: WebDataset's read with
            ``drop_last``).
    """
    going_on = [state["stream"][STREAM_ELSEWHERE] for state in states if STREAM_ELSEWHERE in state["stream"]]
    if not going_on:
        partitions = []
        for state in states:
            if FRESH_PASS in state["stream"] or int(state["stream"]["epoch"]) != epoch:  # a worker yet to start it
                partitions.append(Partition(None))
                continue
            refusal = source.refusal(state["stream"])
            if refusal is not None:
                raise IncompatibleStateError(
                    f"{refusal}. Resume on {first.world_size} processes with num_workers={first.num_workers} and"
                    f" batch_size={first.batch_size}"
                )
            read, batch = int(state["yielded"]), first.batch_size
            whole, partial = divmod(read, batch)
            place = copy.deepcopy(source.place_of(state["stream"]))
            partitions.append(Partition(place, read, whole + (partial > 0), partial > 0))
        sequence = {
            "first": [first.world_size, first.num_workers, first.batch_size],
            "partitions": [partition.to_state() for partition in partitions],
            "turn": 0,
            "current": None,
        }
        start = sum(partition.read for partition in partitions)
        return {"epoch": epoch, "sequence": sequence, "start": start, "batches": batches, **_layout(layout)}
    runs = {(entry["start"], entry["batches"]) for entry in going_on}
    if len(runs) != 1:
        raise StateFormatError(f"the stream states of one checkpoint were written by several runs: {sorted(runs)}")
    entry = going_on[0]
    saved_layout = Layout(*entry["layout"])
    target = entry["start"] + (batches - entry["batches"]) * saved_layout.world_size * saved_layout.batch_size
    for each in going_on:
        partitions = [Partition.from_state(raw) for raw in each["sequence"]["partitions"]]
        position, ended = sum(p.read for p in partitions), all(p.ended for p in partitions)
        if position == target or (ended and position < target):
            sequence = copy.deepcopy(each["sequence"])
            return {"epoch": epoch, "sequence": sequence, "start": position, "batches": batches, **_layout(layout)}
    raise StateFormatError(
        f"no worker's stream state is at the checkpoint's global position ({target} items of the epoch):"
        " the checkpoint's states do not belong together"
    )


def declared_order(loader: Any, dataset: Any, unreadable: str | None) -> Layout | None:
    """The layout whose global order every epoch begun is read in, whatever the layout reading it (as Mosaic's
    canonical nodes fix its order), that a ``loader``'s stream declares (`STREAM_ORDER_ATTRIBUTE`: ``(world_size,
    num_workers, batch_size)``, ``batch_size`` ``None`` for a stream batched in its pipeline) on ``loader.dataset`` or
    ``dataset`` (a library's stream taken over); ``None``: each epoch begun is the reading layout's own.
    ``unreadable``: why the stream cannot be read in another layout's order (``None``: it can).

    Raises:
        UnsupportedLoaderError: it is not such a layout, batches otherwise than the loader, or the stream cannot be
            read in another layout's order.
    """
    found = (getattr(each, STREAM_ORDER_ATTRIBUTE, None) for each in (loader.dataset, dataset))
    value = next((each for each in found if each is not None), None)
    if value is None:
        return None
    valid = isinstance(value, tuple | list) and len(value) == 3
    world_size, num_workers, batch_size = value if valid else (0, 0, 0)
    valid = valid and all(type(each) is int for each in (world_size, num_workers)) and world_size >= 1
    valid = valid and num_workers >= 0 and (batch_size is None or (type(batch_size) is int and batch_size >= 1))
    if not valid:
        raise UnsupportedLoaderError(
            f"the stream's {STREAM_ORDER_ATTRIBUTE} is {value!r:.100}: give (world_size, num_workers, batch_size), the"
            " layout of the run's first launch, batch_size None for a stream batched in its pipeline"
        )
    if (batch_size is None) != (loader.batch_size is None):
        raise UnsupportedLoaderError(
            f"the stream's {STREAM_ORDER_ATTRIBUTE} has batch_size={batch_size} and its loader"
            f" batch_size={loader.batch_size}: a stream batched in its pipeline reads batches, one batched by the"
            " loader samples, so one cannot be read in the other's order"
        )
    if unreadable is not None:
        raise UnsupportedLoaderError(f"the stream declares {STREAM_ORDER_ATTRIBUTE}, but {unreadable}")
    if loader.drop_last:
        raise UnsupportedLoaderError(
            f"the stream declares {STREAM_ORDER_ATTRIBUTE} and its loader drop_last=True: {DROPS_LAST}. Pass"
            " drop_last=False"
        )
    return Layout(world_size, num_workers, batch_size or 1)


def fresh_plan(epoch: int, order: Layout, layout: Layout) -> dict[str, Any]:
    """The plan of ``epoch`` begun on ``layout`` and read in ``order``'s global order from its start, as
    `resume_plan`'s: every partition of ``order`` at its start."""
    partitions = [Partition(None).to_state() for _ in range(order.world_size * order.workers)]
    first = [order.world_size, order.num_workers, order.batch_size]
    sequence = {"first": first, "partitions": partitions, "turn": 0, "current": None}
    return {"epoch": epoch, "sequence": sequence, "start": 0, "batches": 0, **_layout(layout)}


def _layout(layout: Layout) -> dict[str, Any]:
    return {"layout": [layout.world_size, layout.num_workers, layout.batch_size]}


def sequence_from_state(
    raw: Mapping[str, Any], source: Partitions, seed: int, epoch: int, seed_globals: bool
) -> GlobalSequence:
    """The `GlobalSequence` of a state's ``sequence`` entry, its partitions opened by ``source``.

    Raises:
        StateFormatError: it is malformed.
    """
    try:
        first = Layout(*(int(value) for value in raw["first"]))
        partitions = [Partition.from_state(each) for each in raw["partitions"]]
        turn, current = int(raw["turn"]), raw["current"]
        held = None if current is None else (int(current[0]), int(current[1]))
    except (KeyError, TypeError, ValueError) as error:
        raise StateFormatError(f"a stream state of an epoch going on elsewhere is malformed: {error}") from error
    if not 0 <= turn < first.world_size or first.batch_size < 1:
        raise StateFormatError(f"a stream state of an epoch going on elsewhere is malformed: {dict(raw)!r:.200}")
    return GlobalSequence(first, partitions, turn, held, source, seed, epoch, seed_globals)
