"""Every piece of Hugging Face ``datasets`` internals this library reads, in one place.

Checked against datasets 5.2 (the version CI installs); ``tests/test_datasets_internals.py`` fails
if they move. ``datasets`` is never imported here: a dataset of another library is not one of its.
"""

from __future__ import annotations

__all__ = ["shuffle_buffer_size"]


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
