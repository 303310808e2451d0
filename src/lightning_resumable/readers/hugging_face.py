"""Hugging Face ``datasets`` internals, in two places: here, what is read of a dataset (its example
iterables' chain, ``_ex_iterable``, walked for a shuffle buffer, and replaced in a copy), and
`lightning_resumable.readers.hf_windows`, the example iterable that replaces the buffer (its base
class, the chain's state-dict protocol, the buffer's and the shard interleave's fields).

Read of a dataset also: its node split (``_distributed``, a dataclass of ``rank`` and ``world_size``), replaced in a
copy to read another rank's share (`split_as`).

Checked against datasets 5.2 (the version CI installs); ``tests/test_datasets_internals.py`` fails
if they move. ``datasets`` is never imported here: a dataset of another library is not one of its.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

__all__ = ["read_as_saved", "shuffle_buffer_size", "split_as", "split_by_examples", "take_over_buffers"]


def shuffle_buffer_size(dataset: object) -> int | None:
    """The shuffle buffer of a ``datasets.IterableDataset`` shuffled with ``.shuffle(seed, buffer_size)``
    (``map`` and ``split_dataset_by_node`` after it included), or ``None``: ``datasets`` does not save
    that buffer in its ``state_dict``."""
    if type(dataset).__module__.split(".")[0] != "datasets":
        return None
    pending = [getattr(dataset, "_ex_iterable", None)]
    while pending:
        node = pending.pop()
        if node is None:
            continue
        if type(node).__name__ == "BufferShuffledExamplesIterable":
            return int(getattr(node, "buffer_size", 0))
        pending.append(getattr(node, "ex_iterable", None))
        pending.extend(getattr(node, "ex_iterables", None) or [])
    return None


def split_by_examples(dataset: object) -> bool:
    """Whether ``datasets`` splits ``dataset`` by node by keeping every ``world_size``-th example of one stream
    (``split_dataset_by_node`` with ``strategy="examples"``, or ``"auto"`` where its shards do not divide among
    the ranks; datasets 5.0's shuffle reads its shards as one source), after the shuffle: then every rank must read
    that stream in one order. Else each rank reads shards of its own."""
    distributed = getattr(dataset, "_distributed", None)
    if distributed is None:
        return False
    strategy = getattr(distributed, "strategy", "auto")  # (a release before 5.2 has none: "auto")
    if strategy == "shards":
        return False
    shards = int(dataset._ex_iterable.num_shards)  # type: ignore[attr-defined]
    return strategy == "examples" or shards % int(distributed.world_size) != 0


def split_as(dataset: object, rank: int, world_size: int) -> Any:
    """A copy of ``dataset`` (a ``datasets.IterableDataset``) split as ``split_dataset_by_node`` splits it for ``rank``
    of ``world_size`` with its strategy; one not split is every rank's whole stream."""
    copied = copy.copy(dataset)
    copied.__dict__ = dict(dataset.__dict__)  # (datasets' __getstate__ hands out its own __dict__)
    distributed = getattr(dataset, "_distributed", None)
    if distributed is not None:
        copied._distributed = dataclasses.replace(distributed, rank=rank, world_size=world_size)  # type: ignore[attr-defined]
    return copied


def take_over_buffers(dataset: object, seed: int, rank: int, seed_reads: bool) -> Any:
    """A copy of ``dataset`` (a ``datasets.IterableDataset``) whose shuffle buffers are replaced by windows
    that resume exactly (`lightning_resumable.readers.hf_windows`), or ``None`` if it has no buffer."""
    if shuffle_buffer_size(dataset) is None:
        return None
    from lightning_resumable.readers.hf_windows import replace_buffers  # imports datasets, installed here

    taken = copy.copy(dataset)
    taken.__dict__ = dict(dataset.__dict__)  # datasets' __getstate__ hands out its own __dict__: a copy shares it
    order_rank = None if split_by_examples(dataset) else rank
    taken._ex_iterable = replace_buffers(dataset._ex_iterable, seed, rank, seed_reads, order_rank)  # type: ignore[attr-defined]
    taken._prepare_ex_iterable_for_iteration()  # type: ignore[attr-defined]  # its state before a pass, as datasets' constructor sets it
    return taken


def read_as_saved(dataset: object, state: object) -> None:
    """Before a restore of ``dataset`` (a stream) from ``state``: a Hugging Face stream's windows read their shards as
    the checkpoint's run read them, as Arrow tables or example by example
    (`lightning_resumable.readers.hf_windows.read_as_saved`); any other stream is left as it is."""
    if type(dataset).__module__.split(".")[0] != "datasets" or not hasattr(dataset, "_ex_iterable"):
        return
    from lightning_resumable.readers.hf_windows import read_as_saved as windows_read_as_saved

    windows_read_as_saved(dataset, state)
