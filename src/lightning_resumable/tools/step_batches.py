"""The samples of any step, from a checkpoint: ``python -m lightning_resumable batches CKPT --steps 40700-40900``.

Promise: the order is a pure function of the data state (seed, epoch, position, the setup, the skipped data),
so the sample ids each rank read at a step before the checkpoint, or will read at one after it, are computed
without a Trainer, a loader or the data: one keyed permutation per batch, time linear in the steps asked
for. A step is placed as Lightning counts them (``accumulate_grad_batches`` batches a step, a short window at
an epoch's end, ``limit_train_batches``), on the world size that wrote the checkpoint. Where the state does not
determine the order (a stream, a batch sampler, a weighted or subset sampler, several loaders, a world size
changed earlier), `OrderUnknownError` says so: the audit log (``audit_dir``) holds what was trained.

A mixture's order also depends on its schedule, which is configuration, not state: pass the ``Mixture`` the run
builds (``mixture=``) and each sample is ``[source, index]`` (its chunk too, for a chunked source). Its stream is
computed from the run's start with that schedule and the weights the training set (the checkpoint records
those): a run whose weights or sources changed at a resume read another stream before it (its audit log holds it).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_resumable.core.mixture import Mixture
from lightning_resumable.core.mixture_sampler import MixtureSampler
from lightning_resumable.core.sampler import ResumableSampler
from lightning_resumable.core.skips import Layout
from lightning_resumable.core.step_layout import epoch_batches, sampler_layout
from lightning_resumable.errors import OrderUnknownError
from lightning_resumable.format.envelope import STATE_KEY, Envelope, LoaderState, MixtureState, parse
from lightning_resumable.format.skips import StepRange, StepRanges, step_ranges
from lightning_resumable.format.state import DataState
from lightning_resumable.tools.checkpoint_file import load_data_state

__all__ = ["StepBatch", "step_batches"]

_AUDIT = "the audit log (ResumableDataCallback(audit_dir=...)) records what each step trained"


@dataclass(frozen=True)
class StepBatch:
    """What one rank reads at one step: its epoch and batches (Lightning's count in the epoch), and the
    samples (dataset indices; for a mixture ``[source, index]``, with the chunk of a chunked source's)."""

    step: int
    rank: int
    epoch: int
    batches: tuple[int, ...]
    samples: list[Any]
    trained: bool  # read before the checkpoint (else: will be read after it)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "rank": self.rank,
            "epoch": self.epoch,
            "batches": list(self.batches),
            "samples": self.samples,
            "trained": self.trained,
        }


def _sampler(state: DataState, rank: int, mixture: Mixture | None) -> ResumableSampler:
    if mixture is not None:
        sampler: ResumableSampler = MixtureSampler(mixture, state.world_size, rank, state.seed, state.batch_size)
        assert isinstance(sampler, MixtureSampler)
        sampler.set_samples_per_epoch(state.dataset_size)
        return sampler
    if state.draws not in ("permutation", "sequential"):
        raise OrderUnknownError(
            f"the train loader draws {state.draws}: its order depends on the sampler's own arguments, which the"
            f" checkpoint does not hold; {_AUDIT}"
        )
    return ResumableSampler(
        range(state.dataset_size), state.world_size, rank, state.shuffle, state.seed, state.drop_last,
        state.batch_size, drop_last_batch=bool(state.drop_last_batch),
    )  # fmt: skip


class _Steps:
    """Where the steps lie, read backwards and forwards from the checkpoint's step."""

    def __init__(self, sampler: ResumableSampler, state: DataState, step: int, accumulate: int, limit: Any) -> None:
        sampler.restore(state)
        self.layout: Layout = sampler_layout(sampler, step, accumulate, limit)
        self.sampler, self.step, self.accumulate, self.limit = sampler, step, accumulate, limit

    def place(self, step: int) -> tuple[int, int]:
        if step >= self.step:
            return self.layout.place(step)
        epoch, batch, at = self.layout.epoch, self.layout.batch, self.step
        at -= -(-batch // self.accumulate)  # the step the checkpoint's epoch started with
        while step < at:
            epoch -= 1
            if epoch < 0:
                raise OrderUnknownError(f"step {step} lies before the run's first step (by the checkpoint's count)")
            at -= -(-epoch_batches(self.sampler, epoch, self.limit) // self.accumulate)
        return epoch, (step - at) * self.accumulate

    def batches_in(self, epoch: int) -> int:
        return self.layout.batches_in(epoch)


def _envelope(checkpoint: str | Path | Mapping[str, Any]) -> tuple[Envelope, int]:
    if isinstance(checkpoint, Mapping):
        loaded = checkpoint
    else:
        loaded, _ = load_data_state(Path(checkpoint))
    envelope = parse(loaded["callbacks"][STATE_KEY])
    return envelope, int(loaded.get("global_step", 0))


def step_batches(
    checkpoint: str | Path | Mapping[str, Any],
    steps: StepRanges,
    *,
    ranks: list[int] | None = None,
    accumulate_grad_batches: int = 1,
    limit_train_batches: int | float | None = None,
    mixture: Mixture | None = None,
) -> list[StepBatch]:
    """What each rank read (before the checkpoint) or will read (after it) at ``steps`` (``"40700-40900"``...),
    from the checkpoint (a path, or the loaded dict) alone; by step, then rank.

    Raises:
        OrderUnknownError: the checkpoint's state does not determine the order of these steps.
        MissingStateError, StateFormatError: no data state, or a malformed one.
    """
    envelope, global_step = _envelope(checkpoint)
    body = envelope.state
    if isinstance(body, MixtureState):
        if mixture is None:
            raise OrderUnknownError(
                "a mixture's order depends on its weight schedule, which is configuration, not state: call"
                " lightning_resumable.tools.step_batches.step_batches(checkpoint, steps, mixture=<the run's Mixture>);"
                f" {_AUDIT}"
            )
        state = body.loader.state
    elif isinstance(body, LoaderState):
        state, mixture = body.state, None
    else:
        kind = "no state" if body is None else body.described
        raise OrderUnknownError(f"the checkpoint holds {kind}, whose order the state does not determine; {_AUDIT}")
    if state.anchor_position not in (0, None):
        raise OrderUnknownError(f"the checkpoint's epoch resumed on another world size mid-epoch; {_AUDIT}")
    holes = tuple(hole for skip in envelope.skips for hole in skip.holes)
    wanted: tuple[StepRange, ...] = step_ranges(steps)
    locate = _locator(mixture) if mixture is not None else None
    listed = []
    for rank in ranks if ranks is not None else range(state.world_size):
        if not 0 <= rank < state.world_size:
            raise OrderUnknownError(f"rank {rank}: the checkpoint was written by {state.world_size} processes")
        sampler = _sampler(state, rank, mixture)
        sampler.holes = holes
        if isinstance(sampler, MixtureSampler) and isinstance(body, MixtureState):
            for change in body.mixture.changes:  # weights the training set
                sampler.stream.add_change(change.position, tuple(sorted(change.parts.items())), change.period)
        where = _Steps(sampler, state, global_step, accumulate_grad_batches, limit_train_batches)
        reader = _sampler(state, rank, mixture)
        reader.holes = holes
        if isinstance(reader, MixtureSampler) and isinstance(sampler, MixtureSampler):
            reader.stream = sampler.stream
        for each in wanted:
            for step in range(each.first, each.last + 1):
                epoch, first = where.place(step)
                last = min(first + accumulate_grad_batches, where.batches_in(epoch))
                reader.set_epoch(epoch)
                indices = [index for batch in range(first, last) for index in reader.batch_indices(batch)]
                samples: list[Any] = indices if locate is None else [locate(index) for index in indices]
                listed.append(StepBatch(step, rank, epoch, tuple(range(first, last)), samples, step < global_step))
    return sorted(listed, key=lambda entry: (entry.step, entry.rank))


def _locator(mixture: Mixture) -> Callable[[int], list[Any]]:
    """A mixture index as ``[source, index]``, and ``[source, index, chunk]`` in a chunked source (the chunks'
    first indices summed once)."""
    starts = {name: list(itertools.accumulate(chunks.sizes, initial=0)) for name, chunks in mixture.chunks.items()}

    def locate(index: int) -> list[Any]:
        name, within = mixture.locate(index)
        if name not in starts:
            return [name, within]
        return [name, within, bisect.bisect_right(starts[name], within) - 1]

    return locate
