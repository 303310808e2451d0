"""The Hugging Face ``datasets`` internals `lightning_resumable.readers.hugging_face` reads, against the installed
version, and the refusal of a shuffled stream that ``datasets`` cannot resume exactly."""

from __future__ import annotations

from typing import Any

import pytest
from torch.utils.data import DataLoader

from lightning_resumable import UnsupportedLoaderError
from lightning_resumable.readers.build import make_resumable
from lightning_resumable.readers.hugging_face import shuffle_buffer_size

datasets = pytest.importorskip("datasets")


def stream() -> Any:
    def rows() -> Any:
        for row in range(16):
            yield {"id": row}

    return datasets.IterableDataset.from_generator(rows).map(lambda example: example)


def test_the_shuffle_buffer_is_found_through_maps_and_the_split_by_node() -> None:
    from datasets.distributed import split_dataset_by_node

    assert shuffle_buffer_size(stream()) is None
    shuffled = split_dataset_by_node(stream().shuffle(seed=1, buffer_size=16).map(lambda e: e), rank=0, world_size=2)
    assert shuffle_buffer_size(shuffled) == 16
    assert shuffle_buffer_size(stream().shuffle(seed=1, buffer_size=1)) == 1
    assert shuffle_buffer_size([1, 2]) is None, "not a datasets object"


def test_a_shuffled_hugging_face_stream_is_refused_unless_allowed() -> None:
    loader = DataLoader(stream().shuffle(seed=1, buffer_size=16), batch_size=2)
    with pytest.raises(UnsupportedLoaderError, match="shuffled with a buffer of 16 samples"):
        make_resumable(loader, seed=0, num_replicas=1, rank=0)
    with pytest.warns(RuntimeWarning, match="shuffle buffer"):
        make_resumable(loader, seed=0, num_replicas=1, rank=0, allow_inexact_streams=True)
    make_resumable(DataLoader(stream(), batch_size=2), seed=0, num_replicas=1, rank=0)  # unshuffled: exact
