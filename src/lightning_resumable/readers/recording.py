"""What a stream's loader read in its current pass: the state before each of its last few batches, and
those batches, counted from the start of the epoch.

Promise: the state and the next batch's digest at the trainer's count of completed batches are known
after Lightning has read one batch ahead; the first batch after a restore is compared with the
digest the checkpoint recorded. One `PassRecord` per loader, shared by every reader of a stream
(`lightning_resumable.readers.streams.StreamLoader`, LitData's and MosaicML Streaming's loaders).
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Iterator, Mapping
from types import MethodType
from typing import Any

from lightning_resumable.core import randomness
from lightning_resumable.core.global_batch import sample_digests
from lightning_resumable.core.verification import digest_of
from lightning_resumable.errors import StreamPositionError

__all__ = ["FRESH_PASS", "PassRecord"]

FRESH_PASS = "lightning_resumable.fresh_pass"
"""The key of a state after no batch of a fresh pass (its epoch): nothing of the epoch was read, so a resume on
another layout reads it in that layout's own order (LitData's loader, a WebDataset pipeline)."""

_KEPT = 3
"""Batches (and states) kept: Lightning reads at most one batch ahead."""


class PassRecord:
    """The current pass of one loader: its states and batches by index in the epoch.

    Args:
        name: the loader, as errors name it.
        state: the loader's state now, or ``None`` when the state is computed from the count alone (MosaicML
            Streaming's global sample count). Taken before every batch, so its cost is each batch's: it must
            share nothing that changes as the loader reads on, and need not be a copy where nothing is shared
            (a copy is handed out by `state_after`).
        state_at_end: take the state again when the pass runs out (torchdata's marks it finished).
    """

    def __init__(
        self,
        name: str,
        state: Callable[[], dict[str, Any]] | None,
        state_at_end: bool = False,
    ) -> None:
        held = _LoaderMethod(state) if isinstance(state, MethodType) else state
        self.name, self._state, self._state_at_end = name, held, state_at_end
        self.batches = 0  # batches of the current epoch yielded, counting those before a restore
        self._states: dict[int, dict[str, Any]] = {}
        self._read: dict[int, Any] = {}
        self._finished_at: int | None = None
        self._pending: tuple[int, dict[str, Any] | None] | None = None  # (batches, state) restored, not yet read
        self._source: Iterator[Any] | None = None  # the pass's batches
        self._restore_globals = False
        self._ahead: tuple[Any] | None = None  # batch ``self.batches``, read and not handed out yet
        self._expected_first: str | None = None  # the digest the first batch after a restore must have
        self.first_batch: tuple[str, str] | None = None  # (expected, read) digests of that batch, once read
        self._first_samples_of: int | None = None  # the batch size of a first batch whose samples are digested
        self.first_samples: list[str] | None = None  # the digests of that batch's samples, once read
        self.epoch = 0  # the pass's epoch (its reader's `pass_epoch`)
        # Skipped steps (`lightning_resumable.lightning.stream_owner`): per pass, the batches to read and discard
        # before a batch index, from (first index, resumed); and, once done, (epoch, index, discarded, left: what
        # the pass's end cut off).
        self.discards: Callable[[int, bool], dict[int, int]] | None = None
        self.discarded: Callable[[int, int, int, int], None] | None = None
        self._discard_at: dict[int, int] = {}

    def resume(self, batches: int, state: Mapping[str, Any] | None = None, next_batch: str = "") -> None:
        """The next pass continues ``batches`` batches into the epoch (from ``state``, if the loader cannot
        give its restored state back before it reads); ``next_batch``: the digest its first batch must
        have, ``""``: unknown."""
        self._pending = (batches, dict(state) if state is not None else None)
        self.expect_first(next_batch)

    def expect_first(self, next_batch: str) -> None:
        """The next pass's first batch must have the digest ``next_batch`` (``""``: unknown)."""
        self._expected_first, self.first_batch = next_batch or None, None

    def digest_first_samples(self, batch_size: int) -> None:
        """Digest the samples of the next pass's first batch (`first_samples`), of up to ``batch_size`` samples: a
        resume on another layout checks the global batch (`lightning_resumable.core.global_batch`)."""
        self._first_samples_of, self.first_samples = batch_size, None

    @property
    def holds_state(self) -> bool:
        """Whether the loader's state is taken (else it is computed from the count: skipped data cannot be read)."""
        return self._state is not None

    @property
    def started(self) -> bool:
        """Whether a pass has begun in this process (`record`)."""
        return self._source is not None

    @property
    def resuming(self) -> bool:
        """Whether the next pass continues a restored state."""
        return self._pending is not None

    def record(self, batches: Iterator[Any], restore_globals: bool = False) -> Iterator[Any]:
        """``batches``, one pass, recorded; ``restore_globals``: the samples are read here (no workers), so
        put the global generators back after each batch (they are the training step's)."""
        pending, self._pending = self._pending, None
        self.batches = pending[0] if pending is not None else 0
        self._states, self._read, self._finished_at, self._ahead = {}, {}, None, None
        if pending is not None and pending[1] is not None:
            self._states[self.batches] = pending[1]  # the loader may not give it back before it reads
        self._source, self._restore_globals = batches, restore_globals
        self._discard_at = self.discards(self.batches, pending is not None) if self.discards is not None else {}
        return self._recording(self._state.loader() if isinstance(self._state, _LoaderMethod) else None)

    def _recording(self, loader: object) -> Iterator[Any]:
        """The pass's batches; ``loader`` (whose state this record takes) is kept alive while they are read."""
        while True:
            if self._ahead is None and not self._read_next():
                return
            assert self._ahead is not None
            (batch,), self._ahead = self._ahead, None
            if self._expected_first is not None:
                self.first_batch, self._expected_first = (self._expected_first, digest_of(batch)), None
            if self._first_samples_of is not None:
                self.first_samples, self._first_samples_of = sample_digests(batch, self._first_samples_of), None
            self.batches += 1
            yield batch

    def _read_next(self) -> bool:
        """Read batch ``self.batches`` of the epoch into ``self._ahead``, its state recorded before; False:
        the pass has run out."""
        if self._finished_at is not None or self._source is None or not self._discard():
            return False
        if self._state is not None and self.batches not in self._states:
            self._states[self.batches] = self._state()
        self._states.pop(self.batches - _KEPT, None)
        self._read.pop(self.batches - _KEPT, None)
        read = self._next()
        if read is None:
            return False
        self._read[self.batches], self._ahead = read[0], read
        return True

    def _next(self) -> tuple[Any] | None:
        """The source's next batch (in a 1-tuple), the global generators put back if the samples are read here;
        ``None``: the pass has run out, its end recorded."""
        assert self._source is not None
        saved = randomness.GlobalGeneratorState() if self._restore_globals else None
        try:
            return (next(self._source),)
        except StopIteration:
            self._finished_at = self.batches
            if self._state is not None and self._state_at_end:
                self._states[self.batches] = self._state()
            return None
        finally:
            if saved is not None:
                saved.restore()

    def _discard(self) -> bool:
        """Read and discard the batches skipped before batch ``self.batches`` (its state is then the one after
        them); False: the pass ran out (what was left to discard is reported to ``discarded``)."""
        due = self._discard_at.pop(self.batches, 0)
        read = 0
        while read < due and self._next() is not None:
            read += 1
        if due and self.discarded is not None:
            self.discarded(self.epoch, self.batches, read, due - read)
        return read == due

    def read_ahead(self, batches: int) -> None:
        """At a save after ``batches`` batches, read the next batch now if Lightning has not (it reads
        ahead only for a loader without a length), so that its digest is recorded: the pass hands it
        out next, as it would have read it."""
        if batches == self.batches and self._ahead is None:
            self._read_next()

    def state_after(self, batches: int) -> dict[str, Any]:
        """The loader's state after ``batches`` batches of the current epoch.

        Raises:
            StreamPositionError: that state is not among the last few (the trainer's count and the
                loader's disagree by more than Lightning's look-ahead).
        """
        assert self._state is not None, "a loader whose state is computed from the count"
        if batches in self._states:
            return copy.deepcopy(self._states[batches])  # a copy handed out: the record's stays as it was taken
        if self._pending is not None and batches == self._pending[0]:  # restored, not read yet
            return copy.deepcopy(self._pending[1]) if self._pending[1] is not None else self._state()
        if batches == self.batches:  # no look-ahead (a sized stream, or the first batch)
            if self._discard_at.get(batches) and self._source is not None and self._finished_at is None:
                self._discard()  # the state after this batch is the one after the skipped data
                if batches in self._states:
                    return copy.deepcopy(self._states[batches])
            return self._state()
        raise StreamPositionError(
            f"the trainer has completed {batches} batches of this epoch but {self.name} has yielded"
            f" {self.batches}; its state at batch {batches} is not known"
        )

    def finished_after(self, batches: int) -> bool:
        """Whether the pass had run out after ``batches`` batches."""
        return self._finished_at == batches

    def next_batch_digest(self, batches: int) -> str:
        """The digest of batch ``batches`` of the epoch (the one after ``batches`` completed ones), if it
        has been read (Lightning reads a batch ahead); else ``""``.

        At a save between steps that batch has not reached ``training_step`` yet, so it is as the
        loader made it.
        """
        return digest_of(self._read[batches]) if batches in self._read else ""

    def next_sample_digests(self, batches: int, batch_size: int) -> list[str]:
        """The digests of the samples of batch ``batches`` of the epoch (`next_batch_digest`'s), if it has been read
        and its samples can be told apart; else ``[]``."""
        return sample_digests(self._read[batches], batch_size) if batches in self._read else []


class _LoaderMethod:
    """A loader's own method (its state), the loader held weakly: the loader holds its record, which holds the
    pass's iterator, and a cycle through them would leave that iterator to the garbage collector, which closes its
    queues before it shuts its workers down (torch then waits 5 s for each)."""

    def __init__(self, method: MethodType) -> None:
        self.function, self.loader = method.__func__, weakref.ref(method.__self__)

    def __call__(self) -> dict[str, Any]:
        loader = self.loader()
        if loader is None:
            raise ReferenceError("the loader of this pass record is gone")
        state: dict[str, Any] = self.function(loader)
        return state
