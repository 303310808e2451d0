"""The first global batch after a stream's resume on another layout, checked sample by sample.

Promise: a stream whose position is global (Mosaic's) resumes on another world size with other batches per rank,
so no rank's batch can be compared with a batch the checkpoint recorded. What stays is the global batch: the
samples every rank trains together at the next step. At the save each rank records a digest of each sample of the
batch it trains next (`sample_digests`); after the resume each rank digests the samples of its first batch, and
the samples of all ranks together must be those of all saving ranks together (as a multiset: a layout may deal a
step's samples to its ranks in another order). A batch whose samples cannot be told apart, or a global batch of
another size, is not checked, and the log says so.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from lightning_resumable.core.verification import digest_of
from lightning_resumable.errors import ResumeVerificationError

__all__ = ["check_first_global_batch", "sample_digests"]


def sample_digests(batch: object, batch_size: int) -> list[str]:
    """The digest of each sample of a collated ``batch`` of up to ``batch_size`` samples; ``[]`` where its samples
    cannot be told apart (no tensor, array or list holds them along its first dimension, or two readings of it
    disagree: a list of ``batch_size`` batched fields or of ``batch_size`` samples)."""
    listed = len(batch) if isinstance(batch, (list, tuple)) else None  # a list of samples: a last one is shorter
    for size in dict.fromkeys((batch_size, _leading_size(batch), listed)):
        if size is not None and 0 < size <= batch_size:
            samples = _split(batch, size)
            if samples is not None:
                return [digest_of(sample) for sample in samples]
    return []


def _leading_size(value: object) -> int | None:
    """The first dimension of the first tensor or array in ``value`` (a last, partial batch is smaller)."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return int(value.shape[0]) if value.ndim else None
    items = value.values() if isinstance(value, Mapping) else value if isinstance(value, (list, tuple)) else ()
    for item in items:
        size = _leading_size(item)
        if size is not None:
            return size
    return None


def _split(value: object, size: int) -> list[Any] | None:
    """``value`` as ``size`` samples, or ``None``."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return list(value) if value.ndim and value.shape[0] == size else None
    if isinstance(value, Mapping):
        fields = {key: _split(item, size) for key, item in value.items()}
        if not fields or any(parts is None for parts in fields.values()):
            return None
        return [{key: parts[index] for key, parts in fields.items() if parts is not None} for index in range(size)]
    if isinstance(value, (list, tuple)):
        split = [_split(item, size) for item in value]
        by_field = None if not split or any(parts is None for parts in split) else split
        as_samples = list(value) if len(value) == size else None
        if by_field is not None and as_samples is not None:
            return None  # both readings fit: which one the collation meant is not known
        if by_field is not None:
            return [tuple(parts[index] for parts in by_field if parts is not None) for index in range(size)]
        return as_samples
    return None


def check_first_global_batch(
    recorded: Sequence[Sequence[str]],
    read: Sequence[Sequence[str] | None],
    epoch: int,
    batches: int,
    in_order: bool = False,
    epoch_end: bool = False,
) -> str:
    """Compare the samples all ranks read first after the resume with those all saving ranks recorded.

    ``recorded``: each saving rank's sample digests; ``read``: each resumed rank's (``None`` or ``[]``: unknown).
    ``in_order``: the resumed layout deals the global sequence rank after rank (LitData's epoch resumed
    elsewhere): the samples both hold are compared in order, whatever the two global batches' sizes. Else the
    global sequence is dealt anew in each step (Mosaic's): the smaller of the two global batches must be part of the
    larger (another batch size regroups one sequence); at ``epoch_end`` (the epoch's last global batch on the resumed
    layout) up to one sample per rank of either layout may differ: the samples a layout repeats to share the last one
    among its ranks.

    Returns:
        ``""`` if checked, else why not (for the log).

    Raises:
        ResumeVerificationError: on every rank, counting the samples that differ.
    """
    if any(not samples for samples in recorded) or any(not samples for samples in read):
        return "a batch whose samples cannot be told apart (its collation keeps no first dimension per sample)"
    if in_order:
        before = [digest for samples in recorded for digest in samples]
        after = [digest for samples in read for digest in samples or ()]
        both = min(len(before), len(after))
        differing = sum(1 for one, other in zip(before[:both], after[:both], strict=True) if one != other)
        if differing:
            raise ResumeVerificationError(
                f"the first global batch after the checkpoint (epoch {epoch}, after {batches} batches), read on another"
                f" layout, is not the one the checkpoint recorded: {differing} of the {both} samples both hold differ"
                " in the global order; training on would not continue the interrupted run. If the stream cannot"
                " yield the same samples twice, pass ResumableDataCallback(verify=False)"
            )
        return ""
    saved = collections.Counter(digest for samples in recorded for digest in samples)
    now = collections.Counter(digest for samples in read for digest in samples or ())
    smaller, larger = (saved, now) if saved.total() <= now.total() else (now, saved)
    differing = (smaller - larger).total()
    repeated = (len(recorded) - 1) + (len(read) - 1) if epoch_end else 0
    if differing > repeated:
        raise ResumeVerificationError(
            f"the first global batch after the checkpoint (epoch {epoch}, after {batches} batches), read on another"
            f" layout, is not the one the checkpoint recorded: {differing} of the {smaller.total()} samples of the"
            f" {'checkpoint' if smaller is saved else 'resumed run'}'s (of {saved.total()} recorded and"
            f" {now.total()} read) are not among the other's; training on would not continue the interrupted run."
            " The stream's global position means other samples on this layout (another shuffle seed, canonical"
            " node count or data). If the stream cannot yield the same samples twice, pass"
            " ResumableDataCallback(verify=False)"
        )
    if differing:
        return f"{differing} samples of the epoch's last global batch differ, as its layouts repeat others in it"
    return ""
