"""The batches a map-style loader actually produced (in its workers, or in the main process without
them): the self-check's view of what the uninterrupted run trains next.

Promise: at a save between steps, the digest of the next batch is the digest of the batch the
loader's iterator handed to Lightning (Lightning reads one batch ahead), not of a copy fetched again
in the main process, whose dataset may hold other state than the workers' copies. After a restore
the first batch the iterator hands out is digested before it trains, and compared on every rank
(`lightning_resumable.lightning.owners`).

Only the last two batches are kept, by reference: the one training and the one read ahead, which
Lightning (or the iterator) holds anyway. The iterator's batch reading is wrapped on the instance
(`lightning_resumable.internals._torch`), so the iterator's class stays torch's, as Lightning's worker shutdown
checks.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from torch.utils.data import DataLoader

from lightning_resumable.core.verification import digest_of
from lightning_resumable.internals._torch import (
    batches_handed_out,
    has_shut_down,
    iterator_factory,
    next_batch_function,
    replace_next_batch,
    set_iterator_factory,
)

__all__ = ["ProducedBatches", "watch_loader"]

_KEPT = 2
_UNWATCHED = "_lightning_resumable_unwatched_iterator_factory"

Where = tuple[int, int, int]
"""(epoch, cycle, batch index in that cycle of the epoch)."""


class ProducedBatches:
    """The last batches one loader's iterators produced, by where they sit in the epoch.

    Args:
        start_of_pass: ``(epoch, cycle, batches before the pass)`` of the pass being read, asked
            once its first batch has been produced (the sampler has started that pass by then).
    """

    def __init__(self, start_of_pass: Callable[[], Where]) -> None:
        self._start_of_pass = start_of_pass
        self._kept: dict[Where, Any] = {}
        self._start: Where | None = None  # of the pass being read, once its first batch is produced
        self._expected_first: tuple[Where, str] | None = None
        self._read_ahead: Callable[[int], None] = lambda batch: None
        self.first_batch: tuple[str, str] | None = None  # (expected, produced) digests after a restore

    def expect_first(self, where: Where, digest: str) -> None:
        """The batch at ``where``, if it is the first one produced from now on, must have ``digest``
        (``""``: nothing to compare). A first batch elsewhere (Lightning ended the epoch) is not compared."""
        self._expected_first, self.first_batch = ((where, digest) if digest else None), None

    def _produced(self, batch: Any, yielded_before: int) -> None:
        if yielded_before == 0:  # the first batch of a pass
            self._start, self._kept = self._start_of_pass(), {}
        assert self._start is not None
        epoch, cycle, before = self._start
        where = (epoch, cycle, before + yielded_before)
        if self._expected_first is not None:
            (expected_where, digest), self._expected_first = self._expected_first, None
            if where == expected_where:
                self.first_batch = (digest, digest_of(batch))
        self._kept[where] = batch
        self._kept.pop((epoch, cycle, where[2] - _KEPT), None)

    def digest_at(self, epoch: int, cycle: int, batch: int) -> str:
        """The digest of batch ``batch`` of ``cycle`` of ``epoch``, read now from the iterator if it has
        not been (Lightning reads ahead only for a loader without a length; the batch is handed out
        next, as it would have been); ``""`` if it is not the next one of the pass being read."""
        where = (epoch, cycle, batch)
        if where not in self._kept and self._start is not None and self._start[:2] == where[:2]:
            self._read_ahead(batch)
        kept = self._kept.get(where, _MISSING)
        return "" if kept is _MISSING else digest_of(kept)

    def watch(self, iterator: Any) -> Any:
        """``iterator``, each batch it hands out recorded here (no reference from it back to itself)."""
        unbound = next_batch_function(iterator)
        if unbound is None:
            return iterator  # not torch's iterator: nothing to watch
        reference, record = weakref.ref(iterator), self
        ahead: list[tuple[int, Any]] = []  # (batches handed out when read, the batch or what its read raised)

        def read(watched: Any) -> Any:
            yielded_before = batches_handed_out(watched)
            batch = unbound(watched)
            record._produced(batch, yielded_before)
            return batch

        def next_batch() -> Any:
            watched = reference()
            assert watched is not None
            if ahead:
                read_at, item = ahead.pop()
                if read_at == batches_handed_out(watched):  # else a pass reset since (persistent workers)
                    if isinstance(item, Exception):
                        raise item  # the pass's end, or a failed fetch: where it would have been raised
                    return item
            return read(watched)

        def read_ahead(batch: int) -> None:
            watched = reference()
            if watched is None or ahead or record._start is None or has_shut_down(watched):
                return  # a retired iterator's workers are gone: torch would skip the batches they owed
            if record._start[2] + batches_handed_out(watched) != batch:
                return
            try:
                ahead.append((batches_handed_out(watched), read(watched)))
            except Exception as raised:
                ahead.append((batches_handed_out(watched), raised))

        replace_next_batch(iterator, next_batch)
        self._read_ahead = read_ahead
        return iterator


_MISSING = object()


class _WatchedFactory:
    """Makes the loader's iterators, each watched by ``produced``. A watch belongs to the run: a pickled
    loader (``torch.save(trainer)``, a spawned worker) carries the loader's own factory instead."""

    def __init__(self, produced: ProducedBatches, make: Callable[[], Any]) -> None:
        self.produced, self.make = produced, make

    def __call__(self) -> Any:
        return self.produced.watch(self.make())

    def __reduce__(self) -> tuple[Any, ...]:
        return _unwatched, (self.make,)


def _unwatched(make: Callable[[], Any]) -> Callable[[], Any]:
    return make


def watch_loader(loader: DataLoader[Any], produced: ProducedBatches) -> None:
    """Record in ``produced`` every batch of every iterator ``loader`` makes from now on (replacing a
    previous watch of the same loader)."""
    make = loader.__dict__.get(_UNWATCHED) or iterator_factory(loader)
    loader.__dict__[_UNWATCHED] = make
    set_iterator_factory(loader, _WatchedFactory(produced, make))
