"""A stream resumed on another layout: another world size, number of workers or batch size (issue 55), for a
stream whose first-layout workers' streams can be opened anywhere (`Partitions`: a WebDataset pipeline's shards, a
Hugging Face stream's split).

Promise: the interrupted epoch goes on in the global order the layout that began it would have trained it, and
the next epochs are the new layout's own (as a fresh run of it reads them), as LitData's loader resumed elsewhere
does (`lightning_resumable.readers.litdata_elsewhere`):

- the first layout's order is its **partitions'** (one per rank and worker: what that worker reads, each item drawn
  under its own seed) read in torch's turns: a rank's loader takes its workers' batches in turn and passes over one
  that has run out (`tests/test_torch_internals.py`), and the global sequence is step after step, rank after rank in
  a step. `GlobalSequence` reads it lazily from the partitions' saved places, so nothing needs the partitions'
  lengths in advance: where a partition ends is found where the first layout found it, by reading it;
- the resumed run deals the rest of that sequence to its ranks in global batches of its own size (a last uneven
  global batch padded with its own items, repeated), and its workers take the batches in torch's turns. A stream
  has no random access, so **each resumed worker reads every partition** and keeps its own batches (where the
  partitions can hand out samples whose items are made apart, only its own are made): the rest of that one epoch
  costs up to the number of the new layout's workers (all ranks') times the reading; a restore re-reads what a
  same-layout restore of each partition re-reads;
- the state of a worker inside that epoch is the sequence's place (each partition's place, items read, batches,
  end found; the rank whose turn it is), and a save takes the one at the checkpoint's global position, so a chain
  resumes it again, on any layout (`lightning_resumable.readers.elsewhere_plan`).
"""

from __future__ import annotations

import collections
import copy
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from lightning_resumable.core import randomness
from lightning_resumable.errors import IncompatibleStateError, StateFormatError
from lightning_resumable.format._keys import stream_key, stream_sample_seed

__all__ = [
    "STREAM_ELSEWHERE",
    "GlobalSequence",
    "Layout",
    "Made",
    "Opened",
    "Partition",
    "Partitions",
    "rest_items",
]

STREAM_ELSEWHERE = "lightning_resumable.stream_elsewhere"
"""The key of a stream state whose epoch goes on on another layout than the one that began it."""

Opened = tuple[Iterator[Any], Callable[[], dict[str, Any]]]
"""A partition opened: its items (or samples, made into items apart: `Made`), and its place now."""

Made = Callable[[Any], tuple[bool, Any]]
"""A sample -> ``(True, its item)``, or ``(False, None)`` if the pipeline dropped it."""


class Partitions(Protocol):
    """A stream whose first-layout workers' streams ("partitions") can be opened in any process of any layout."""

    def maker(self) -> Made | None:
        """Where `open` hands out samples whose items are made apart (the stages after the shuffle make at most one of
        each): what makes one; ``None``: `open` hands out items."""

    def open(self, epoch: int, first: Layout, rank: int, worker: int, place: dict[str, Any] | None) -> Opened:
        """Worker ``worker`` of rank ``rank`` of ``first``: its stream of ``epoch`` from ``place`` (``None``: its
        start)."""

    def place_of(self, state: Mapping[str, Any]) -> dict[str, Any] | None:
        """The place in a worker's saved stream state (``None``: its start)."""

    def refusal(self, state: Mapping[str, Any]) -> str | None:
        """Why a worker's saved stream state cannot go on on another layout; ``None``: it can."""


@dataclass(frozen=True)
class _Sample:
    """A partition's sample not yet made into its item: made only by the worker whose batch holds it."""

    number: int
    read: int
    sample: Any


@dataclass(frozen=True)
class Layout:
    """A loader's layout: ``world_size`` processes, ``num_workers`` workers each, batches of ``batch_size`` items."""

    world_size: int
    num_workers: int
    batch_size: int

    @property
    def workers(self) -> int:
        """The partitions per rank: its workers, or the rank itself without any."""
        return max(self.num_workers, 1)


@dataclass
class Partition:
    """One worker's stream of the first layout: its window place, the items read of it (their seeds are keyed by
    the count), the batches begun of it, and whether its end was found."""

    place: dict[str, Any] | None
    read: int = 0
    batches: int = 0
    ended: bool = False

    def to_state(self) -> list[Any]:
        return [copy.deepcopy(self.place), self.read, self.batches, self.ended]

    @classmethod
    def from_state(cls, raw: object) -> Partition:
        if not (isinstance(raw, list) and len(raw) == 4 and (raw[0] is None or isinstance(raw[0], dict))):
            raise StateFormatError(f"a stream partition's state is malformed: {raw!r:.200}")
        place, read, batches, ended = raw
        if type(read) is not int or type(batches) is not int or type(ended) is not bool or min(read, batches) < 0:
            raise StateFormatError(f"a stream partition's state is malformed: {raw!r:.200}")
        return cls(copy.deepcopy(place), read, batches, ended)


class GlobalSequence:
    """The first layout's global sequence of an epoch from a place in it, read lazily (see the module).

    Args:
        first: the layout that began the epoch.
        partitions: each of its (rank, worker) streams' place, rank after rank.
        turn: the rank whose batch is next; ``current``: the partition whose batch is being read and the items left
            of that batch, or ``None`` (the rank picks its next worker).
        source: opens the partitions (`Partitions`); where it hands out samples whose items are made apart
            (``source.maker()``), `item` makes them, only for the items a worker keeps. A sample the stages drop is
            found there and refused (its position would shift every later one).
        seed, epoch: the items' seeds are keyed by them, the partition's rank and worker, and its count.
        seed_globals: each item is read with the global generators seeded, as the first layout read it.
    """

    def __init__(
        self,
        first: Layout,
        partitions: list[Partition],
        turn: int,
        current: tuple[int, int] | None,
        source: Partitions,
        seed: int,
        epoch: int,
        seed_globals: bool,
    ) -> None:
        if len(partitions) != first.world_size * first.workers:
            raise StateFormatError(
                f"a stream state of an epoch begun on {first.world_size} processes with {first.num_workers}"
                f" workers holds {len(partitions)} partitions"
            )
        self.first, self.partitions, self.turn, self.current = first, partitions, turn, current
        self._source, self._seed, self._epoch, self._seed_globals = source, seed, epoch, seed_globals
        self._made = source.maker()
        self._readers: dict[int, Opened] = {}  # the partitions opened

    @property
    def ended(self) -> bool:
        return all(partition.ended for partition in self.partitions)

    def next_item(self) -> tuple[bool, Any]:
        """``(True, item)``: the sequence's next item; ``(False, None)``: the epoch's end."""
        batch = self.first.batch_size
        while not self.ended:
            if self.current is None:
                worker = self._next_worker(self.turn)
                if worker is None:  # every worker of this rank has run out: its turn passes
                    self._pass_turn()
                    continue
                self.current = (self.turn * self.first.workers + worker, batch)
            number, left = self.current
            partition = self.partitions[number]
            found, item = self._read(number)
            if not found:
                partition.ended = True
                self.current = None
                if left < batch:  # a last partial batch: the rank's turn is over
                    self._pass_turn()
                continue  # else the worker had run out: torch passes over it in the same turn
            if left == batch:
                partition.batches += 1
            self.current = (number, left - 1) if left > 1 else None
            if left == 1:
                self._pass_turn()
            return True, item
        return False, None

    def _next_worker(self, rank: int) -> int | None:
        """The worker whose batch ``rank`` takes next: the one of fewest batches (the lowest in a tie), of those
        not found ended (torch's turns, a worker that ran out passed over)."""
        workers = self.first.workers
        live = [w for w in range(workers) if not self.partitions[rank * workers + w].ended]
        return min(live, key=lambda w: (self.partitions[rank * workers + w].batches, w)) if live else None

    def _pass_turn(self) -> None:
        self.turn = (self.turn + 1) % self.first.world_size

    def _read(self, number: int) -> tuple[bool, Any]:
        """Partition ``number``'s next item, under the seed its worker read it under (or its sample, `_Sample`)."""
        partition = self.partitions[number]
        if number not in self._readers:
            rank, worker = divmod(number, self.first.workers)
            self._readers[number] = self._source.open(self._epoch, self.first, rank, worker, partition.place)
        reader = self._readers[number][0]
        if self._made is not None:  # the windows seed their own reads
            try:
                sample = next(reader)
            except StopIteration:
                return False, None
            partition.read += 1
            return True, _Sample(number, partition.read - 1, sample)
        # Each item read under its own seed, its generators left as its reading left them (a collate that draws after
        # the batch's last item draws as the first layout's did, where the batches are the same).
        randomness.begin_sample(self._seed_of(number, partition.read), self._seed_globals)
        try:
            item = next(reader)
        except StopIteration:
            return False, None
        finally:
            randomness.end_sample()
        partition.read += 1
        return True, item

    def _seed_of(self, number: int, read: int) -> int:
        rank, worker = divmod(number, self.first.workers)
        return stream_sample_seed(stream_key(self._seed, self._epoch, rank, worker), read)

    def item(self, entry: Any) -> Any:
        """The item of an entry `next_item` returned: a sample made into it here, under its seed.

        Raises:
            IncompatibleStateError: the pipeline dropped that sample.
        """
        if not isinstance(entry, _Sample):
            return entry
        assert self._made is not None
        randomness.begin_sample(self._seed_of(entry.number, entry.read), self._seed_globals)
        try:
            found, item = self._made(entry.sample)
        finally:
            randomness.end_sample()
        if not found:
            first = self.first
            raise IncompatibleStateError(
                "the stream's pipeline dropped a sample after its shuffle (a map that returned None, or a handler"
                " that skips an error), so the epoch's order on the layout that began it cannot be dealt to this one"
                " apart from reading every sample's stages in every worker. Resume on"
                f" {first.world_size} processes with num_workers={first.num_workers} and batch_size={first.batch_size}"
            )
        return item

    def to_state(self) -> dict[str, Any]:
        """The sequence's place, shared with nothing it reads on with (taken before each batch: one copy of each
        partition's place, the opened ones' from their readers)."""
        opened = {number: place() for number, (_, place) in self._readers.items()}  # copies already
        partitions = [
            [opened[number], each.read, each.batches, each.ended] if number in opened else each.to_state()
            for number, each in enumerate(self.partitions)
        ]
        return {
            "first": [self.first.world_size, self.first.num_workers, self.first.batch_size],
            "partitions": partitions,
            "turn": self.turn,
            "current": list(self.current) if self.current is not None else None,
        }


def rest_items(sequence: GlobalSequence, rank: int, layout: Layout, worker: int) -> Iterator[Any]:
    """The items of ``worker`` of ``rank`` of ``layout`` in the rest of ``sequence``: its batches (global batches of
    ``layout.world_size x layout.batch_size``, rank after rank; this worker's every ``layout.workers``-th from its
    number on), each yielded right after the sequence reads it (its state is then the place after it). A last uneven
    global batch is padded with its own items, repeated in order: the same wherever the epoch was resumed (a chain
    resumed inside that global batch pads it as the run before did, so its recorded next batch is read again)."""
    global_batch = layout.world_size * layout.batch_size
    recent: collections.deque[Any] = collections.deque(maxlen=global_batch)  # the last global batch's items read
    read, ended = 0, False

    def read_to(count: int) -> None:
        nonlocal read, ended
        while read < count and not ended:
            found, item = sequence.next_item()
            if not found:
                ended = True
            else:
                recent.append(item)
                read += 1

    step = worker
    while True:
        read_to(step * global_batch + 1)
        if read <= step * global_batch:  # the rest has no such global batch
            return
        first = step * global_batch + rank * layout.batch_size
        for index in range(first, first + layout.batch_size):
            read_to(index + 1)
            if index < read:
                yield sequence.item(recent[-1])
            else:  # past the rest's end: the last global batch's own items, in turn
                own = read - step * global_batch
                yield sequence.item(recent[len(recent) - own + (index - read) % own])
        step += layout.workers
