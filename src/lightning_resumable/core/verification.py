"""A resume that checks itself: a fingerprint of the batch each rank trains next.

Promise: when a checkpoint is written, every rank records two 8-byte digests of the batch it would
train next: one of its sample keys (dataset indices and per-sample seeds), one of its content (the
collated batch). After a restore, before anything trains, the same batches are fetched again from
the restored state and compared. A dataset re-listed in another order, data regenerated with the
same length, or a changed transform is refused with `ResumeVerificationError`.

The batch is fetched by the library itself, in the main process, each sample under its own seed
(whatever the callback's ``seed_samples``), then collated by the loader's ``collate_fn``: the path is
the same at save and at resume, so it does not depend on Lightning's prefetching or device hooks.
Because keys are global positions, a checkpoint written on ``W`` ranks is verified on any world size:
rank ``j`` of the resumed run re-fetches the batches of the saving ranks ``j, j + W', ...``.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import pickle
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from lightning_resumable.core.mixture import Mixture
from lightning_resumable.core.randomness import SampleSeededDataset
from lightning_resumable.core.sampler import ResumableSampler
from lightning_resumable.errors import ResumeVerificationError, UnfingerprintableBatchError
from lightning_resumable.format.envelope import BatchFingerprint
from lightning_resumable.format.state import DataState

__all__ = [
    "BatchFingerprint",
    "all_gather_objects",
    "check_fingerprints",
    "check_first_stream_batches",
    "check_produced_batches",
    "fingerprint_next_batch",
]

_DIGEST_BYTES = 8


# ----------------------------------------------------------------------------------- digests
def _feed(digest: Any, value: object) -> None:
    """Feed a canonical byte form of a (nested) batch into ``digest``: type, shape and raw bytes."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        tensor = (tensor.to_dense() if tensor.is_sparse else tensor).contiguous()
        digest.update(f"T{tensor.dtype}{tuple(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    elif isinstance(value, np.ndarray) and value.dtype != object:
        digest.update(f"A{value.dtype.str}{value.shape}".encode())
        digest.update(np.ascontiguousarray(value).reshape(-1).view(np.uint8))
    elif value is None or isinstance(value, (bool, int, float, complex, str, bytes, np.generic)):
        digest.update(f"{type(value).__name__}:{value!r};".encode())
    elif isinstance(value, Mapping):
        digest.update(f"M{len(value)}".encode())
        for key, item in value.items():
            _feed(digest, key)
            _feed(digest, item)
    elif isinstance(value, (list, tuple)):
        digest.update(f"L{type(value).__name__}{len(value)}".encode())
        for item in value:
            _feed(digest, item)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        digest.update(f"D{type(value).__qualname__}".encode())
        for field in dataclasses.fields(value):
            _feed(digest, getattr(value, field.name))
    else:
        try:
            digest.update(pickle.dumps(value, protocol=4))
        except Exception as error:
            raise UnfingerprintableBatchError(
                f"cannot fingerprint a batch element of type {type(value).__name__} ({error}); pass"
                " ResumableDataCallback(verify=False) to resume without verification"
            ) from error


def digest_of(value: object) -> str:
    """A 16-hex-digit BLAKE2b digest of a nested batch (tensors, arrays, numbers, strings, containers)."""
    digest = hashlib.blake2b(digest_size=_DIGEST_BYTES)
    _feed(digest, value)
    return digest.hexdigest()


# ---------------------------------------------------------------------------------- the batch
def next_batch_keys(sampler: ResumableSampler, state: DataState, rank: int, world_size: int) -> list[Any]:
    """The sample keys of the batch that ``rank`` of ``world_size`` trains next from ``state``, drawn as
    ``sampler`` draws (a copy is restored; ``sampler`` itself is left as it is)."""
    peek = copy.copy(sampler)
    peek.num_replicas, peek.rank, peek.sample_keys = world_size, rank, True
    peek.batch_size = state.batch_size  # the batch of the run that wrote it (the resume may read others)
    peek.restore(state)
    return list(itertools.islice(iter(peek), state.batch_size))


def fingerprint_next_batch(loader: DataLoader[Any], state: DataState, rank: int, world_size: int) -> BatchFingerprint:
    """Fetch and collate the batch ``rank`` trains next from ``state``, and digest its keys and content.

    The main process's global generators are left as they were.
    """
    dataset, sampler = loader.dataset, loader.sampler
    if not isinstance(dataset, SampleSeededDataset) or not isinstance(sampler, ResumableSampler):
        raise TypeError("the loader must be one that make_resumable built (a SampleSeededDataset, a ResumableSampler)")
    elements = next_batch_keys(sampler, state, rank, world_size)
    keys: list[Any] = elements
    collate = loader.collate_fn
    if elements and isinstance(elements[0], list):  # a batch sampler's stream: one element is the batch
        keys = elements[0]
        collate = dataset.collate_fn or collate
    samples = dataset.fetch(keys, seed_globals=True, restore_globals=True)  # a save may happen mid-step
    batch = collate(samples) if samples else None
    return BatchFingerprint(ids=digest_of(_named(dataset.dataset, keys)), content=digest_of(batch))


def _named(dataset: object, keys: list[Any]) -> list[Any]:
    """The keys as the checkpoint identifies their samples: a `Mixture`'s index names its source and the
    index in it (its sources are taken by name, in any order, some perhaps removed or added)."""
    if not isinstance(dataset, Mixture):
        return keys
    return [(dataset.locate(key[0]), *key[1:]) if isinstance(key, tuple) else dataset.locate(key) for key in keys]


# ------------------------------------------------------------------------------- across ranks
def all_gather_objects(value: Any) -> list[Any]:
    """``value`` of every rank, in rank order (``[value]`` without a process group)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def check_fingerprints(
    loader: DataLoader[Any], state: DataState, saved: Sequence[BatchFingerprint], rank: int, world_size: int
) -> None:
    """Re-fetch the saving ranks' next batches (spread over the current ranks) and compare; collective.

    Raises:
        ResumeVerificationError: on every rank, naming each saving rank whose batch differs.
    """
    local = {
        saving_rank: fingerprint_next_batch(loader, state, saving_rank, state.world_size)
        for saving_rank in range(rank, state.world_size, world_size)
    }
    now: dict[int, BatchFingerprint] = {}
    for part in all_gather_objects(local):
        now.update(part)
    problems = []
    for saving_rank, expected in enumerate(saved):
        got = now[saving_rank]
        if (got.ids, got.content) == (expected.ids, expected.content):  # what a re-fetch can show
            continue
        if got.ids != expected.ids:
            what = (
                f"its sample keys (dataset indices and per-sample seeds) differ (digest {got.ids} now, {expected.ids}"
                " in the checkpoint): the sample order is not the one the checkpoint was written with"
            )
        else:
            what = (
                f"it has the same sample keys but different content (digest {got.content} now, {expected.content}"
                " in the checkpoint): the dataset's content, its order on disk or its transforms changed since"
                " the checkpoint was written"
            )
        problems.append(f"rank {saving_rank}: {what}")
    if problems:
        raise ResumeVerificationError(
            f"the batch after the checkpoint (epoch {state.epoch}, global position {state.position}, written on"
            f" {state.world_size} processes) is not the batch the checkpoint"
            " recorded; training on would not continue the interrupted run. "
            + "; ".join(problems)
            + ". If the dataset cannot return the same content twice under a fixed seed (it reads the clock or"
            " a changing source), pass ResumableDataCallback(verify=False)"
        )


def _differing(read: Sequence[tuple[str, str] | None], what: str) -> list[str]:
    """``"rank r <what> X, not Y"`` for each rank whose ``(recorded, read)`` digests differ."""
    pairs = [(rank, pair) for rank, pair in enumerate(read) if pair is not None and pair[0] != pair[1]]
    return [f"rank {rank} {what} {got}, not {recorded}" for rank, (recorded, got) in pairs]


def check_first_stream_batches(read: Sequence[tuple[str, str] | None], epoch: int, batches: int) -> None:
    """Compare each rank's first batch after a stream's restore with the digest its checkpoint recorded.

    A stream's batch cannot be fetched again from a state (only read on), so each rank's loader
    digests the first batch it reads, before it trains; ``read`` holds every rank's
    ``(recorded, read)`` digests, ``None`` for a rank with nothing recorded.

    Raises:
        ResumeVerificationError: on every rank, naming each rank whose batch differs.
    """
    problems = _differing(read, "read a batch with digest")
    if problems:
        raise ResumeVerificationError(
            f"the first batch after the checkpoint (epoch {epoch}, after {batches} batches) is not the batch the"
            " checkpoint recorded; training on would not continue the interrupted run. "
            + "; ".join(problems)
            + ". Each rank must restore its own stream state (were the ranks' states swapped or edited?), on"
            " the same data (a stream that drops buffered samples or reads other shards after a restore"
            " differs too). If the stream cannot yield the same"
            " batch twice, pass ResumableDataCallback(verify=False)"
        )


def check_produced_batches(read: Sequence[tuple[str, str] | None], epoch: int, where: str, workers: bool) -> None:
    """Compare each rank's first batch after a map-style restore, as its loader produced it, with the
    batch that loader produced at the save (``read``: every rank's ``(recorded, produced)`` digests,
    ``None`` where nothing was recorded). The re-fetch in the main process cannot see state that only
    the workers' copies of the dataset hold; this comparison does.

    Raises:
        ResumeVerificationError: on every rank, naming each rank whose batch differs.
    """
    producer = "the workers" if workers else "the loader"
    problems = _differing(read, "produced digest")
    if problems:
        raise ResumeVerificationError(
            f"the batch {producer} produced after the resume (epoch {epoch}){where} is not the batch the workers"
            " produced there before the checkpoint; training on would not continue the interrupted run. "
            + "; ".join(problems)
            + ". Its sample keys are the same (the main process fetched it again and found the checkpoint's),"
            " so the dataset draws from random state that is not seeded per sample: a generator the library"
            " does not reach (one at module level, or inside a container of more than"
            " lightning_resumable.core.held_generators.MAX_CONTAINER items), or state a worker carries from sample"
            " to sample. Draw from sample_rng(), or keep the generator as an attribute of the dataset or its"
            " transforms. If the content cannot be the same twice, pass ResumableDataCallback(verify=False)"
        )
