"""Chunk-local pass orders (`lightning_resumable.core.chunks`) and how a mixture finds a source's chunks."""

from __future__ import annotations

import functools
from typing import ClassVar

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_resumable import Chunked, Mixture
from lightning_resumable.core.chunks import ChunkedPass, Chunks, chunks_of
from lightning_resumable.core.mixture_sampler import MixtureSampler
from lightning_resumable.errors import MixtureError
from lightning_resumable.format._keys import chunked_pass_seed


def a_pass(chunks: Chunks, seed: int = 3, pass_index: int = 0) -> ChunkedPass:
    return ChunkedPass(chunks, functools.partial(chunked_pass_seed, seed, 99, pass_index))


def chunk_of(sizes: tuple[int, ...], indices: torch.Tensor) -> torch.Tensor:
    ends = torch.cumsum(torch.tensor(sizes), 0)
    return torch.searchsorted(ends, indices, right=True)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=30), st.integers(1, 6), st.integers(0, 2**40))
def test_a_pass_is_a_permutation_read_window_by_window(sizes: list[int], window: int, seed: int) -> None:
    if not any(sizes):
        sizes[0] = 1
    chunks = Chunks(tuple(sizes), window)
    order = a_pass(chunks, seed)
    indices = order(torch.arange(chunks.total))
    assert sorted(indices.tolist()) == list(range(chunks.total))
    # the places of each window read exactly the chunks of that window: at most `window` chunks
    read = chunk_of(chunks.sizes, indices)
    for number, start in enumerate(order.window_starts[:-1].tolist()):
        stop = int(order.window_starts[number + 1])
        window_chunks = order.chunk_order[number * window : (number + 1) * window].tolist()
        assert set(read[start:stop].tolist()) == {chunk for chunk in window_chunks if sizes[chunk]}


def test_any_place_alone_gives_what_the_whole_pass_gives() -> None:
    chunks = Chunks((7, 3, 12, 9, 1, 30, 5), 2)
    whole = a_pass(chunks)(torch.arange(chunks.total))
    places = torch.tensor([66, 0, 13, 40, 2])
    assert a_pass(chunks)(places).tolist() == whole[places].tolist()  # a fresh order: nothing replayed


def test_orders_differ_by_seed_and_pass_and_mix_within_a_window() -> None:
    chunks = Chunks((50,) * 8, 4)
    first, other_pass, other_seed = (a_pass(chunks, 3, 0), a_pass(chunks, 3, 1), a_pass(chunks, 4, 0))
    places = torch.arange(chunks.total)
    assert first(places).tolist() != other_pass(places).tolist() != other_seed(places).tolist()
    window = chunk_of(chunks.sizes, first(places[:200]))
    assert len(set(window[:20].tolist())) > 1  # samples of the window's chunks are mixed, not read chunk after chunk


def test_a_large_source_is_ordered_from_its_chunk_table_alone() -> None:
    chunks = Chunks((10_000,) * 10_000)  # 10^8 samples
    order = a_pass(chunks)
    at = torch.tensor([0, 90_000_000, 99_999_999])
    assert order(at).tolist() == a_pass(chunks)(at).tolist()
    assert order.starts.numel() == 10_001


def test_the_digest_names_sizes_and_window() -> None:
    assert Chunks((3, 4)).digest() != Chunks((4, 3)).digest() != Chunks((3, 4), 2).digest()


@pytest.mark.parametrize(
    ("sizes", "window", "message"),
    [((), 4, "not all 0"), ((0, 0), 4, "not all 0"), ((3, -1), 4, "non-negative ints"), ((3,), 0, "window")],
)
def test_malformed_chunks_are_refused(sizes: tuple[int, ...], window: int, message: str) -> None:
    with pytest.raises(MixtureError, match=message):
        Chunks(sizes, window)


def test_chunked_declares_sizes_or_one_size() -> None:
    data = list(range(10))
    assert chunks_of(Chunked(data, 4, window=2), "a") == Chunks((4, 4, 2), 2)
    assert chunks_of(Chunked(data, [5, 5]), "a") == Chunks((5, 5))
    assert chunks_of(data, "a") is None
    with pytest.raises(MixtureError, match="add up to 9 samples, but the dataset holds 10"):
        Chunked(data, [4, 5])
    with pytest.raises(MixtureError, match="without chunk_sizes"):
        chunks_of(Chunked(data), "a")


def test_an_arrow_dataset_is_chunked_by_its_record_batches() -> None:
    datasets = pytest.importorskip("datasets")
    table = datasets.concatenate_datasets(
        [datasets.Dataset.from_dict({"id": list(range(start, start + 5))}) for start in (0, 5, 10)]
    )
    assert chunks_of(table, "arrow") == Chunks((5, 5, 5))
    with pytest.raises(MixtureError, match="flatten_indices"):
        chunks_of(table.shuffle(seed=1), "arrow")


def test_a_mixture_reads_a_chunked_source_window_by_window_and_each_pass_whole() -> None:
    web, code = Chunked(list(range(120)), 10, window=2), list(range(1000, 1030))
    mixture = Mixture({"web": web, "code": code}, {"web": 3, "code": 1})
    assert mixture.chunks == {"web": Chunks((10,) * 12, 2)}
    sampler = MixtureSampler(mixture, num_replicas=2, rank=0, seed=5, batch_size=4)
    indices = sampler.stream.indices(torch.arange(640))
    web_indices = [index for index in indices.tolist() if index < 120]
    assert sorted(web_indices[:120]) == list(range(120)) and sorted(web_indices[120:240]) == list(range(120))
    for start in range(0, 120, 20):  # each window of 2 chunks of 10 samples: 2 chunks read
        assert len({index // 10 for index in web_indices[start : start + 20]}) == 2
    plain = Mixture({"web": list(range(120)), "code": code}, {"web": 3, "code": 1})
    unchunked = MixtureSampler(plain, num_replicas=2, rank=0, seed=5, batch_size=4).stream.indices(torch.arange(640))
    assert [index >= 120 for index in unchunked.tolist()] == [
        index >= 120 for index in indices.tolist()
    ]  # the same draws


def test_a_data_librarys_source_is_sized_by_its_chunks_not_by_its_len() -> None:
    """LitData's (and Mosaic's) ``len`` is one rank's share under DDP; its chunk table holds every sample."""

    class StreamingDataset(list):  # type: ignore[type-arg]  # LitData's, as far as the chunk table goes
        __module__ = "litdata.streaming.dataset"
        region_of_interest: ClassVar[list[tuple[int, int]]] = [(0, 5), (0, 7)]

        def __len__(self) -> int:
            return 3

    mixture = Mixture({"web": StreamingDataset(range(12)), "code": list(range(4))}, {"web": 1, "code": 1})
    assert mixture.sizes == (12, 4) and mixture.offsets == [0, 12] and len(mixture) == 16
    assert mixture.chunks == {"web": Chunks((5, 7))}


def test_inspect_names_a_chunked_sources_layout() -> None:
    from lightning_resumable.lightning.mixture_owner import MixtureOwner
    from lightning_resumable.lightning.progress import SavePoint
    from lightning_resumable.readers.build import BuildOptions, build_resumable
    from lightning_resumable.tools.summary import _mixture_summary

    mixture = Mixture({"web": Chunked(list(range(12)), 4), "code": list(range(5))}, {"web": 1, "code": 1})
    built = build_resumable(torch.utils.data.DataLoader(mixture, batch_size=2), BuildOptions(3, 1, 0))
    owner = MixtureOwner(built.loader)
    owner.start_fresh(0)
    saved = owner.save(SavePoint(3, 0, 1, False, False, 0, 1, False, False))
    sources = _mixture_summary(saved, None)["loaders"]["train"]["sources"]
    assert sources["web"]["chunks"] == Chunks((4, 4, 4)).digest() and "chunks" not in sources["code"]
