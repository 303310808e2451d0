"""Where a run's steps lie in a `ResumableSampler`'s epochs, as Lightning counts them.

Promise: `epoch_batches` is the number of batches Lightning's loop trains in an epoch (``len`` of the
loader, cut by ``limit_train_batches``), `sampler_layout` the `Layout` of the steps from the sampler's
origin on (``accumulate_grad_batches`` batches a step, a short last window at an epoch's end), which the
skip planner (`lightning_resumable.core.skips`) and ``batches`` (`lightning_resumable.tools.step_batches`) read.
"""

from __future__ import annotations

from lightning_resumable.core.mixture_sampler import MixtureSampler, whole_batches
from lightning_resumable.core.sampler import ResumableSampler
from lightning_resumable.core.skips import Layout

__all__ = ["epoch_batches", "sampler_layout"]


def epoch_batches(sampler: ResumableSampler, epoch: int, limit: int | float | None = None) -> int:
    """The batches one rank trains in ``epoch`` as Lightning counts them (``len`` of the loader, cut by
    ``limit_train_batches``); the current epoch's from its start, batches before a restore included."""
    if epoch == sampler.epoch:
        samples = len(sampler)
    elif isinstance(sampler, MixtureSampler):  # whole global batches of the nominal length
        samples = whole_batches(sampler.draws.length, sampler.global_batch) // sampler.num_replicas
    else:
        length, ranks = sampler.epoch_length(epoch), sampler.num_replicas
        samples = length // ranks if sampler.drop_last else -(-length // ranks)
    batches = samples // sampler.batch_size if sampler.drop_last_batch else -(-samples // sampler.batch_size)
    if isinstance(limit, int) and not isinstance(limit, bool):
        return min(batches, limit)
    return int(batches * limit) if isinstance(limit, float) and limit < 1.0 else batches


def sampler_layout(sampler: ResumableSampler, step: int, accumulate: int, limit: int | float | None) -> Layout:
    """How the steps from ``step`` on lie in ``sampler``'s epochs, from its origin (the batch trained next)."""
    epoch, position, batches = sampler.origin
    global_batch = sampler.batch_size * sampler.num_replicas

    mixture = isinstance(sampler, MixtureSampler)  # one stream: a position counts from the run's start

    def position_of(at_epoch: int, batch: int) -> int:
        within = position + (batch - batches) * global_batch if at_epoch == epoch else batch * global_batch
        return within + (sampler.epoch_start(at_epoch) if isinstance(sampler, MixtureSampler) else 0)

    def batches_in(at_epoch: int) -> int:
        return epoch_batches(sampler, at_epoch, limit)

    return Layout(step, epoch, batches, accumulate, batches_in, position_of, sampler.epoch_length, one_stream=mixture)
