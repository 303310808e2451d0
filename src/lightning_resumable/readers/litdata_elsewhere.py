"""LitData's loader resumed on another layout: another world size, number of workers or batch size (issue 55).

Promise: the interrupted epoch goes on in the order the layout that began it would have read it, and the next
epochs are LitData's own on the new layout (as a fresh run of it reads them), as a map-style loader resumed on
another world size does:

- the epoch's global sequence is the first layout's ranks' batches (`planned_batches`: LitData's plan read in
  torch's turns, without reading a sample), step after step, rank after rank in a step;
- the resumed run deals the rest of it from the checkpoint's global position to its ranks in global batches of its
  own size (a last uneven global batch padded with its own samples, repeated), and reads
  each sample by its chunk and index (`LitDataChunkReader`), under the seed it had (keyed by the epoch and the
  sample's index), with its own workers;
- a save inside that epoch writes `ELSEWHERE`: the first layout and the global position, so a chain resumes it on
  any layout again.

A dataset that declares its order (`lightning_resumable.readers.elsewhere_plan.declared_order`) reads every fresh epoch
on another layout so too, from its start (`declared_epoch`): LitData's samples are read by chunk and index, so each is
read once (where a stream's every worker reads every declared worker's stream).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from litdata import StreamingDataset
from torch.utils.data import Dataset

from lightning_resumable.errors import StateFormatError
from lightning_resumable.format.envelope import StreamState
from lightning_resumable.internals._litdata_plan import planned_batches
from lightning_resumable.readers.stream_elsewhere import Layout

__all__ = ["ELSEWHERE", "Elsewhere", "Remainder", "RemainderSamples", "declared_epoch", "rest_of_epoch"]

ELSEWHERE = "lightning_resumable.elsewhere"
"""The key of a rank's state (the same on every rank) inside an epoch that goes on on another layout."""


@dataclass(frozen=True)
class Elsewhere:
    """Where an epoch begun on one layout stands: that layout (``world_size`` processes on ``num_nodes`` nodes,
    ``num_workers`` workers, batches of ``batch_size``), LitData's ``epoch`` (from 1), and the samples of its global
    sequence trained (``position``) after ``batches`` batches of the resumed run's count."""

    world_size: int
    num_nodes: int
    num_workers: int
    batch_size: int
    epoch: int
    position: int
    batches: int

    def to_state(self) -> dict[str, Any]:
        return {ELSEWHERE: asdict(self)}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Elsewhere:
        raw = state[ELSEWHERE]
        if not isinstance(raw, Mapping) or set(raw) != set(cls.__dataclass_fields__):
            raise StateFormatError(f"a LitData state of an epoch resumed on another layout is malformed: {raw!r:.200}")
        values = {name: raw[name] for name in cls.__dataclass_fields__}
        if any(type(value) is not int or value < 0 for value in values.values()):
            raise StateFormatError(f"a LitData state of an epoch resumed on another layout is malformed: {raw!r:.200}")
        return cls(**values)


def rest_of_epoch(
    dataset: StreamingDataset, saved: StreamState, rank: int, world_size: int, batch_size: int
) -> Remainder:
    """The rest of ``saved``'s epoch for ``rank`` of ``world_size`` in batches of ``batch_size``: its place read from an
    `ELSEWHERE` (an epoch already going on on another layout), else counted in the first layout's plans, which are
    computed once."""
    state = saved.ranks[0]
    if ELSEWHERE in state:
        at = replace(Elsewhere.from_state(state), batches=saved.batches)
        return Remainder(_plans(dataset, at), at, rank, world_size, batch_size)
    own = state["dataset"]
    at = Elsewhere(
        world_size=saved.world_size,
        num_nodes=int(own.get("initial_num_nodes", 1)),
        num_workers=saved.num_workers,
        batch_size=int(saved.batch_size or own["batch_size"]),
        epoch=int(own["current_epoch"]),
        position=0,
        batches=saved.batches,
    )
    plans = _plans(dataset, at)
    trained = sum(len(batch) for plan in plans for batch in plan[: saved.batches])
    return Remainder(plans, replace(at, position=trained), rank, world_size, batch_size)


def declared_epoch(
    dataset: StreamingDataset, order: Layout, epoch: int, rank: int, world_size: int, batch_size: int
) -> Remainder:
    """LitData's ``epoch`` (from 1) read whole in the global order of the declared layout ``order`` (on one node),
    dealt to ``rank`` of ``world_size`` in batches of ``batch_size``."""
    at = Elsewhere(order.world_size, 1, order.num_workers, order.batch_size, epoch, position=0, batches=0)
    return Remainder(_plans(dataset, at), at, rank, world_size, batch_size)


def _plans(dataset: StreamingDataset, at: Elsewhere) -> list[list[list[tuple[int, int]]]]:
    """Each rank's batches of the layout that began the epoch (`planned_batches`)."""
    return [
        planned_batches(
            dataset,
            world_size=at.world_size,
            rank=rank,
            num_workers=at.num_workers,
            batch_size=at.batch_size,
            epoch=at.epoch,
            num_nodes=at.num_nodes,
        )
        for rank in range(at.world_size)
    ]


class Remainder:
    """The rest of an epoch from `Elsewhere` (``at``), whose first layout's ranks read ``plans``, dealt to ``rank`` of
    ``world_size`` in batches of ``batch_size``."""

    def __init__(
        self, plans: list[list[list[tuple[int, int]]]], at: Elsewhere, rank: int, world_size: int, batch_size: int
    ) -> None:
        sequence: list[tuple[int, int]] = []  # step after step, rank after rank in a step
        for step in range(max(map(len, plans), default=0)):
            for plan in plans:
                if step < len(plan):
                    sequence.extend(plan[step])
        rest = sequence[at.position :]
        self.global_batch = world_size * batch_size
        self.steps = math.ceil(len(rest) / self.global_batch)
        # A last uneven global batch is padded with its own samples, in turn: the same wherever the epoch resumed (a
        # chain resumed inside it reads the batch its checkpoint recorded; padded from the rest's first, it did not).
        padding = self.steps * self.global_batch - len(rest)
        own = rest[(self.steps - 1) * self.global_batch :]
        padded = rest + [own[number % len(own)] for number in range(padding)]
        self.pairs = []
        for step in range(self.steps):
            first = step * self.global_batch + rank * batch_size
            self.pairs.extend(padded[first : first + batch_size])
        self.at, self.length = at, len(sequence)

    def state_after(self, batches: int) -> dict[str, Any]:
        """The state after ``batches`` batches of the resumed run's count (those before the resume included)."""
        position = self.at.position + (batches - self.at.batches) * self.global_batch
        return replace(self.at, position=min(position, self.length), batches=batches).to_state()


class RemainderSamples(Dataset[Any]):
    """A rank's samples of a `Remainder`, by position, each read by its chunk and index."""

    def __init__(self, reader: Any, pairs: list[tuple[int, int]]) -> None:
        self.reader, self.pairs = reader, pairs

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, position: int) -> Any:
        chunk, index = self.pairs[position]
        return self.reader.read(chunk, index)
