"""The user's stream read with each sample under its own seed, its state the stream's and its sample count.

Promise: each sample of a stream is drawn under a seed of ``(seed, epoch, rank, worker, samples that worker has
yielded)``, so augmentations drawn from the global generators are the same after a resume; the state handed out
shares nothing the stream reads on with (`lightning_resumable.readers.streams.StreamLoader` records it before each
batch).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from lightning_resumable.core import randomness
from lightning_resumable.format._keys import stream_key, stream_sample_seed
from lightning_resumable.readers.elsewhere_plan import fresh_plan, sequence_from_state
from lightning_resumable.readers.hugging_face import read_as_saved
from lightning_resumable.readers.recording import FRESH_PASS
from lightning_resumable.readers.stream_elsewhere import (
    STREAM_ELSEWHERE,
    GlobalSequence,
    Layout,
    Partitions,
    rest_items,
)

__all__ = ["SeededStream"]


class SeededStream(IterableDataset[Any]):
    """The user's stream, each sample drawn under its own seed.

    Attributes it does not have are read from the wrapped stream, which is ``.dataset``. Its state is
    the stream's and the number of samples this copy (one worker's, in a worker) has yielded in the
    pass, which the sample seeds are keyed by.

    Args:
        dataset: the user's ``IterableDataset`` with ``state_dict``/``load_state_dict``.
        seed: the run's seed.
        rank: this process's rank (derived, never persisted).
        seed_globals: seed torch's, ``random``'s and NumPy's global generators before each sample.
        restore_globals: in the main process, put the global generators back after each sample.
        partitions: where the stream's first-layout workers' streams can be opened anywhere (a WebDataset pipeline's,
            a Hugging Face stream's): an epoch resumed on another layout goes on in its order
            (`lightning_resumable.readers.stream_elsewhere`).
        order: the layout whose global order every epoch begun is read in (the stream's declared one:
            `lightning_resumable.readers.elsewhere_plan.declared_order`; needs ``partitions``); ``layout``: this one.
    """

    def __init__(
        self,
        dataset: IterableDataset[Any],
        seed: int,
        rank: int,
        seed_globals: bool = True,
        restore_globals: bool = True,
        partitions: Partitions | None = None,
        order: Layout | None = None,
        layout: Layout | None = None,
    ) -> None:
        self.dataset = dataset
        self.seed = seed
        self.rank = rank
        self.seed_globals = seed_globals
        self.restore_globals = restore_globals
        # Shared with every worker's copy (as a Hugging Face stream shares its own): a persistent worker keeps its
        # copy from pass to pass, and reads the epoch the main process set for each.
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        self._yielded = 0
        self._restored: dict[str, Any] | None = None  # a state loaded, for the next pass
        self._pass_restored: dict[str, Any] | None = None  # this pass's restored state, until it reads on from it
        self.partitions, self.order, self.layout = partitions, order, layout
        self._elsewhere: dict[str, Any] | None = None  # an epoch going on in another layout's order: its plan
        self._sequence: GlobalSequence | None = None  # that epoch's global sequence, as this copy reads it
        self._pending = False  # a pass asked for (its iterator made) whose first item is not read yet

    def __getattr__(self, name: str) -> Any:
        if name == "dataset":  # not set yet (unpickling): don't recurse
            raise AttributeError(name)
        return getattr(self.dataset, name)

    @property
    def epoch(self) -> int:
        return int(self._epoch)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch, and hand it to the stream (if it has ``set_epoch``) before workers copy it.

        Called in the main process: a Hugging Face stream shares its epoch between worker copies, and
        ``set_epoch`` calls from several workers at once race on it.
        """
        self._epoch.fill_(epoch)
        set_epoch = getattr(self.dataset, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)

    def _take_the_epoch(self) -> None:
        """In a worker kept from pass to pass: its copy of the stream was given an earlier epoch. Handed the
        current one unless the stream shares its epoch (a Hugging Face stream's is the main process's already,
        and its ``set_epoch`` from several workers would race)."""
        set_epoch = getattr(self.dataset, "set_epoch", None)
        if callable(set_epoch) and getattr(self.dataset, "epoch", None) != self.epoch:
            set_epoch(self.epoch)

    def __iter__(self) -> Iterator[Any]:
        """The pass's items. Made, not begun: torch's and torchdata's workers make it as they start a pass (a kept
        worker's next pass too) and take the state then, before its first item (`state_dict`: a fresh pass)."""
        self._pending = True
        return self._read()

    def _read(self) -> Iterator[Any]:
        self._pending = False
        worker = get_worker_info()
        if worker is not None:
            self._take_the_epoch()
        key = stream_key(self.seed, self.epoch, self.rank, worker.id if worker is not None else 0)
        self._pass_restored, self._restored = self._restored, None  # a restore is the next pass's, none later
        self._yielded = int(self._pass_restored["yielded"]) if self._pass_restored is not None else 0
        restore = self.seed_globals and self.restore_globals and worker is None
        if self.reads_in_order and self._pass_restored is None and not self._going_on:  # an epoch begun here
            assert self.order is not None and self.layout is not None
            self._elsewhere = fresh_plan(self.epoch, self.order, self.layout)
        source = self._rest(worker.id if worker is not None else 0) if self._going_on else iter(self.dataset)
        while True:
            seed = stream_sample_seed(key, self._yielded)
            saved = randomness.GlobalGeneratorState() if restore else None
            try:
                randomness.begin_sample(seed, self.seed_globals)
                sample = next(source)
            except StopIteration:
                self._pass_restored = None
                return
            finally:
                randomness.end_sample()
                if saved is not None:
                    saved.restore()
            self._yielded += 1
            self._pass_restored = None  # the stream read on from it: its own state is current
            yield sample

    @property
    def resumes_on_any_layout(self) -> bool:
        """Whether an epoch resumes on another world size, number of workers or batch size, in its order."""
        return self.partitions is not None

    @property
    def reads_in_order(self) -> bool:
        """Whether each epoch begun on this layout is read in another layout's declared order."""
        return self.order is not None and self.order != self.layout

    def resume_elsewhere(self, plan: Mapping[str, Any]) -> None:
        """Read the rest of ``plan``'s epoch (`lightning_resumable.readers.elsewhere_plan.resume_plan`) in the next
        pass: its first layout's global order, dealt to this layout."""
        self._elsewhere = copy.deepcopy(dict(plan))

    @property
    def _going_on(self) -> bool:
        """Whether this pass reads an epoch begun on another layout (a kept worker's next epoch is its own)."""
        if self._elsewhere is not None and int(self._elsewhere["epoch"]) != self.epoch:
            self._elsewhere = self._sequence = None
        return self._elsewhere is not None

    def _rest(self, worker: int) -> Iterator[Any]:
        assert self._elsewhere is not None and self.partitions is not None
        plan = self._elsewhere
        self._sequence = sequence_from_state(
            plan["sequence"], self.partitions, self.seed, self.epoch, self.seed_globals
        )
        return rest_items(self._sequence, self.rank, Layout(*plan["layout"]), worker)

    def state_dict(self) -> dict[str, Any]:
        if self._going_on:
            assert self._elsewhere is not None
            sequence = (
                self._sequence.to_state() if self._sequence is not None else copy.deepcopy(self._elsewhere["sequence"])
            )
            place = {**self._elsewhere, "sequence": sequence}
            return {"stream": {"epoch": self.epoch, STREAM_ELSEWHERE: place}, "yielded": self._yielded}
        restored = self._restored if self._restored is not None else self._pass_restored
        if restored is not None:  # restored, not read from yet: a Hugging Face stream would report the
            return copy.deepcopy(restored)  # state it had before the load (it applies one as it reads)
        if self._pending:  # a pass not begun: the stream and the count are still the last pass's (a kept worker's)
            return {"stream": {"epoch": self.epoch, FRESH_PASS: True}, "yielded": 0}
        stream = self.dataset.state_dict()  # type: ignore[attr-defined]
        if not _hands_out_copies(self.dataset):  # a stream may hand out what it reads on with (its loader records it)
            stream = copy.deepcopy(stream)
        return {"stream": stream, "yielded": self._yielded}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if FRESH_PASS in state["stream"]:  # saved before its pass began: the pass starts afresh
            self._restored = None
            return
        read_as_saved(self.dataset, state["stream"])  # a Hugging Face stream's windows read as the saved run read them
        self.dataset.load_state_dict(state["stream"])  # type: ignore[attr-defined]
        self._restored = copy.deepcopy(dict(state))


def _hands_out_copies(dataset: object) -> bool:
    """Whether ``dataset``'s ``state_dict`` returns a copy of its state: a Hugging Face ``IterableDataset``'s does."""
    return type(dataset).__module__.split(".")[0] == "datasets"
