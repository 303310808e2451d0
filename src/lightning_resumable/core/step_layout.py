"""Where a run's steps lie in a `ResumableSampler`'s epochs, as Lightning counts them.

Promise: `epoch_batches` is the number of batches Lightning's loop trains in an epoch (``len`` of the
loader, cut by ``limit_train_batches``), `sampler_layout` the `Layout` of the steps from the sampler's
origin on (``accumulate_grad_batches`` batches a step, a short last window at an epoch's end), which the
skip planner (`lightning_resumable.core.skips`) and ``batches`` (`lightning_resumable.tools.step_batches`) read.
Given ``numbered_by``, the state a checkpoint was written with on another world size or batch size, the layout is
the steps as that run numbered them (its ranks' batches), read from the same origin: a skip named in those steps
is placed where they lay.
"""

from __future__ import annotations

from lightning_resumable.core.mixture_sampler import MixtureSampler, whole_batches
from lightning_resumable.core.sampler import ResumableSampler
from lightning_resumable.core.skips import Layout
from lightning_resumable.format.state import DataState

__all__ = ["epoch_batches", "sampler_layout"]


def epoch_batches(
    sampler: ResumableSampler, epoch: int, limit: int | float | None = None, numbered_by: DataState | None = None
) -> int:
    """The batches one rank trains in ``epoch`` as Lightning counts them (``len`` of the loader, cut by
    ``limit_train_batches``); the current epoch's from its start, batches before a restore included. With
    ``numbered_by``: as the run that wrote that state on its world size counted them."""
    ranks = sampler.num_replicas if numbered_by is None else numbered_by.world_size
    batch_size = sampler.batch_size if numbered_by is None else numbered_by.batch_size
    global_batch = batch_size * ranks
    if epoch == sampler.epoch and numbered_by is None:
        samples = len(sampler)
    elif epoch == sampler.epoch and numbered_by is not None:  # the restored epoch's rest, on the layout that wrote it
        _, position, batches = sampler.origin
        rest = max(0, _current_length(sampler, numbered_by) - position)
        samples = batches * batch_size + (rest // ranks if sampler.drop_last else -(-rest // ranks))
    elif isinstance(sampler, MixtureSampler):  # whole global batches of the nominal length
        samples = whole_batches(sampler.draws.length, global_batch) // ranks
    else:
        length = sampler.epoch_length(epoch)
        samples = length // ranks if sampler.drop_last else -(-length // ranks)
    batches = samples // batch_size if sampler.drop_last_batch else -(-samples // batch_size)
    if isinstance(limit, int) and not isinstance(limit, bool):
        return min(batches, limit)
    return int(batches * limit) if isinstance(limit, float) and limit < 1.0 else batches


def _current_length(sampler: ResumableSampler, numbered_by: DataState) -> int:
    """Positions in the current epoch's stream as the run that wrote ``numbered_by`` had it: a map-style epoch's
    are the same on any world size; a mixture's epoch ends on whole global batches of that run's."""
    if isinstance(sampler, MixtureSampler) and numbered_by.stream_length is not None:
        return numbered_by.stream_length
    return sampler.stream_length


def sampler_layout(
    sampler: ResumableSampler,
    step: int,
    accumulate: int,
    limit: int | float | None,
    numbered_by: DataState | None = None,
) -> Layout:
    """How the steps from ``step`` on lie in ``sampler``'s epochs, from its origin (the batch trained next); with
    ``numbered_by`` (a state written on another world size), as the run that wrote it numbered them."""
    epoch, position, batches = sampler.origin
    ranks = sampler.num_replicas if numbered_by is None else numbered_by.world_size
    global_batch = (sampler.batch_size if numbered_by is None else numbered_by.batch_size) * ranks

    mixture = isinstance(sampler, MixtureSampler)  # one stream: a position counts from the run's start

    def epoch_start(at_epoch: int) -> int:
        if not isinstance(sampler, MixtureSampler):
            return 0
        if numbered_by is None or at_epoch == epoch:
            return sampler.epoch_start(at_epoch)
        current = sampler.epoch_start(epoch) + _current_length(sampler, numbered_by)
        return current + (at_epoch - epoch - 1) * whole_batches(sampler.draws.length, global_batch)

    def position_of(at_epoch: int, batch: int) -> int:
        within = position + (batch - batches) * global_batch if at_epoch == epoch else batch * global_batch
        return within + epoch_start(at_epoch)

    def batches_in(at_epoch: int) -> int:
        return epoch_batches(sampler, at_epoch, limit, numbered_by)

    return Layout(step, epoch, batches, accumulate, batches_in, position_of, sampler.epoch_length, one_stream=mixture)
