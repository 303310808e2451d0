"""`lightning_resumable.readers.litdata` against the installed LitData (CI's extras step; skipped without it):
the state at the trainer's count survives Lightning's look-ahead, a restore is not overwritten before
its pass begins, and a resumed pass that Lightning stops at its length, without exhausting it, is not
replayed as the next epoch."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from lightning.pytorch import seed_everything

from lightning_resumable.errors import UnsupportedLoaderError, WorldSizeChangedError
from lightning_resumable.format.envelope import StreamState

from .e2e import train
from .helpers import assert_reader_resumes_exactly, read

litdata = pytest.importorskip("litdata")

from lightning_resumable.readers.base import BuildOptions  # noqa: E402
from lightning_resumable.readers.litdata import LitDataLoader, build, make_litdata_resumable  # noqa: E402

BATCHES = 12  # 48 samples in batches of 4, one process


@pytest.fixture(scope="module")
def chunks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("litdata") / "chunks"
    train.write_litdata(directory, 48)
    return directory


def loader(chunks: Path, num_workers: int, epoch: list[int]) -> LitDataLoader:
    context = {"multiprocessing_context": "fork"} if num_workers else {}  # litdata.optimize sets spawn
    user = litdata.StreamingDataLoader(train.litdata_stream(chunks), batch_size=4, num_workers=num_workers, **context)
    return make_litdata_resumable(user, seed=3, epoch_source=lambda: epoch[0])


@pytest.mark.parametrize("stop", [3, 0])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_resume_at_the_trainers_count_continues_the_epoch_and_the_next_one_is_fresh(
    chunks: Path, num_workers: int, stop: int
) -> None:
    """The readers' suite; the resumed pass is never exhausted (LitData's ``restore`` flag stays set). At 0
    batches (a save before an epoch's first batch, a preemption before the first batch): LitData starts a pass at
    its first batch, and the state before was the last pass's end, from which a resume read nothing."""
    assert_reader_resumes_exactly(
        lambda epoch, workers: loader(chunks, workers, epoch), stop=stop, length=BATCHES, workers=(num_workers,) * 2
    )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_pass_resumed_twice_reads_the_uninterrupted_epoch(chunks: Path, num_workers: int) -> None:
    """A save in a resumed pass, resumed again (a fit preempted again in the epoch it resumed): with workers, the
    main process's dataset kept its own epoch through the first restore and wrote it in the second save."""
    epoch = [0]
    full = loader(chunks, num_workers, epoch)
    read(iter(full), BATCHES)
    epoch[0] = 1
    expected = read(iter(full), BATCHES)
    first = loader(chunks, num_workers, epoch)
    trained = read(iter(first), 2)[:1]  # one trained, the next read ahead
    state = first.state_after(1)
    second = loader(chunks, num_workers, epoch)
    second.resume_from(state, 1)
    trained += read(iter(second), 3)[:2]
    third = loader(chunks, num_workers, epoch)
    third.resume_from(second.state_after(3), 3)
    assert trained + read(iter(third), BATCHES - 3) == expected
    for each in (full, first, second, third):
        each.retire_workers()


def test_another_layout_resumes_the_epoch_at_its_place_and_a_combined_dataset_is_refused(chunks: Path) -> None:
    """A plain ``StreamingDataset``'s state on another layout becomes its place in the epoch's global sequence
    (`Elsewhere`: the layout that began it, the samples trained); a fresh pass stays one; a
    ``CombinedStreamingDataset``'s layout is still its own (`WorldSizeChangedError`)."""
    from lightning_resumable.readers.litdata_elsewhere import Elsewhere

    saving = loader(chunks, 2, [0])
    batches = iter(saving)
    for _ in range(3):
        next(batches)
    saved = StreamState(1, 0, 3, 1, 2, False, False, [saving.state_after(3)], reader="litdata", batch_size=4)
    del batches
    saving.retire_workers()
    resuming = loader(chunks, 0, [0])
    assert resuming.world_size_refusal(saved) is None
    at = Elsewhere.from_state(resuming.state_for_rank(saved, 0, 1))
    assert (at.world_size, at.num_workers, at.batch_size, at.epoch, at.position, at.batches) == (1, 2, 4, 1, 12, 3)
    fresh = replace(saved, batches=0, ranks=[saving.state_after(0)])
    assert resuming.state_for_rank(fresh, 0, 1) == saving.state_after(0)
    combined = litdata.CombinedStreamingDataset([train.litdata_stream(chunks), train.litdata_stream(chunks)])
    other = make_litdata_resumable(litdata.StreamingDataLoader(combined, batch_size=4), seed=3, epoch_source=lambda: 0)
    assert other.world_size_refusal(saved) is not None
    with pytest.raises(WorldSizeChangedError, match="does not resume LitData elastically yet"):
        other.state_for_rank(saved, 0, 2)


def test_a_seeded_dataset_pickles_for_a_spawned_worker_as_the_users_class_seeded_again(chunks: Path) -> None:
    import pickle

    dataset = litdata.StreamingDataset(str(chunks))
    make_litdata_resumable(litdata.StreamingDataLoader(dataset, batch_size=4), seed=3, epoch_source=lambda: 0)
    copied = pickle.loads(pickle.dumps(dataset))
    assert type(copied).__mro__[1] is litdata.StreamingDataset  # the user's class, seeded again:
    assert {"__getitem__", "__reduce__"} <= set(vars(type(copied)))


def test_a_chunk_source_read_in_the_rank_pickles_for_a_worker_not_forked_and_reads_the_same(chunks: Path) -> None:
    # (A mixture's LitData source read in the rank holds its chunks in a wrapper of LitData's cache, pickled with the
    # dataset for the next epoch's forkserver or spawn workers: its attribute lookup recursed while unpickling.)
    import pickle

    from lightning_resumable.readers.litdata import mixture_source

    source = mixture_source(train.litdata_stream(chunks), window=2)

    def sample(dataset: Any, index: int) -> list[Any]:  # an id and its tensor, augmented by the same draws
        seed_everything(index, verbose=False)
        return [part.tolist() if hasattr(part, "tolist") else part for part in dataset[index]]

    read_in_the_rank = [sample(source, index) for index in (0, 17, 40)]
    copied = pickle.loads(pickle.dumps(source))
    assert [sample(copied, index) for index in (0, 17, 40)] == read_in_the_rank
    every = range(len(source))
    assert [sample(copied, index) for index in every] == [sample(source, index) for index in every]


def test_a_combined_dataset_is_resumed_without_workers_and_refused_with_them(chunks: Path) -> None:
    """LitData sums a combined dataset's counts over the workers, and its resume then reads other samples
    (tests/e2e/test_litdata.py resumes one exactly without workers)."""
    combined = litdata.CombinedStreamingDataset([train.litdata_stream(chunks), train.litdata_stream(chunks)], seed=5)
    made = make_litdata_resumable(litdata.StreamingDataLoader(combined, batch_size=4), seed=3, epoch_source=lambda: 0)
    assert isinstance(made, LitDataLoader)
    with_workers = litdata.StreamingDataLoader(combined, batch_size=4, num_workers=2)
    with pytest.raises(UnsupportedLoaderError, match=r"iterate_over_all=True\) with num_workers > 0") as refused:
        make_litdata_resumable(with_workers, seed=3, epoch_source=lambda: 0)
    name = chunks.name  # the directory names the source; two of one directory are numbered
    written = f"DataLoader(Mixture({{'{name}-0': StreamingDataset(...), '{name}-1': StreamingDataset(...)}},"
    assert written in str(refused.value) and "batch_size=4, num_workers=2)" in str(refused.value)


def test_a_weighted_combined_dataset_is_read_as_the_equivalent_mixture(chunks: Path) -> None:
    """``iterate_over_all=False`` (LitData's only way to give weights): a Mixture of its datasets by directory
    name, with its weights, read chunk by chunk with the user's batch size and workers."""
    second = chunks.parent / "second"
    if not (second / "index.json").exists():
        train.write_litdata(second, 24, first=1000)
    datasets = [train.litdata_stream(chunks), train.litdata_stream(second)]
    combined = litdata.CombinedStreamingDataset(datasets, seed=9, weights=[7, 3], iterate_over_all=False)
    built = build(
        litdata.StreamingDataLoader(combined, batch_size=4, num_workers=2), BuildOptions(seed=3, num_replicas=2, rank=0)
    )
    assert built.mixture is not None and built.loader.num_workers == 2 and built.loader.batch_size == 4
    mixture = built.mixture.mixture
    assert mixture.names == (chunks.name, "second") and mixture.sizes == (48, 24)
    assert {name: float(weight) for name, weight in mixture.schedule.weights_at(0).items()} == {
        chunks.name: 0.7,
        "second": 0.3,
    }
    assert mixture.chunks[chunks.name].sizes == (6,) * 8  # the chunks litdata.optimize wrote
    # ordered by the run's seed, which a resume restores and which seeds each step, not the dataset's 9
    assert built.mixture.seed == 3


@pytest.mark.parametrize("option", ["per_stream", "mixed_shuffle"])
def test_a_weighted_combined_dataset_a_mixture_cannot_honour_is_refused_printing_the_mixture(
    chunks: Path, option: str
) -> None:
    datasets = [train.litdata_stream(chunks), train.litdata_stream(chunks)]
    if option == "mixed_shuffle":
        datasets[1] = litdata.StreamingDataset(str(chunks), shuffle=False)
    batching = "per_stream" if option == "per_stream" else "stratified"
    combined = litdata.CombinedStreamingDataset(
        datasets, weights=[1, 1], iterate_over_all=False, batching_method=batching
    )
    with pytest.raises(UnsupportedLoaderError, match="cannot be read as a Mixture; write DataLoader\\(Mixture"):
        build(litdata.StreamingDataLoader(combined, batch_size=4), BuildOptions(seed=3, num_replicas=1, rank=0))


def _pairs(batch: list[Any]) -> list[Any]:
    return batch


def test_a_refused_combined_datasets_printed_mixture_keeps_the_users_collate_fn(chunks: Path) -> None:
    combined = litdata.CombinedStreamingDataset(
        [train.litdata_stream(chunks), train.litdata_stream(chunks)],
        weights=[1, 1],
        iterate_over_all=False,
        batching_method="per_stream",
    )
    options = BuildOptions(seed=3, num_replicas=1, rank=0)
    with pytest.raises(UnsupportedLoaderError, match=r"num_workers=0, collate_fn=_pairs\)$"):
        build(litdata.StreamingDataLoader(combined, batch_size=4, collate_fn=_pairs), options)
    with pytest.raises(UnsupportedLoaderError, match=r"batch_size=4, num_workers=0\)$"):  # LitData's own: not printed
        build(litdata.StreamingDataLoader(combined, batch_size=4), options)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_state_recorded_before_a_batch_is_unchanged_after_the_pass_reads_on(chunks: Path, num_workers: int) -> None:
    """LitData's state is recorded before every batch sharing its datasets' lists of chunks and regions (copying them
    was a quarter of the library's time a sample): the installed LitData must leave them as they were, through an
    epoch's end and the next epoch's start."""
    import copy

    epoch = [0]
    reader = loader(chunks, num_workers, epoch)
    batches = iter(reader)
    read(batches, 3)
    recorded = reader.record._states[2]
    taken = copy.deepcopy(recorded)
    assert len(list(batches)) == BATCHES - 3  # to the pass's end
    epoch[0] = 1
    assert len(list(reader)) == BATCHES
    assert recorded == taken
    assert recorded["dataset"]["subsampled_files"] is not None


@pytest.mark.parametrize(("num_workers", "batch_size"), [(0, 4), (2, 4), (2, 5), (3, 4)])
def test_litdatas_order_on_a_layout_is_its_plan_read_in_the_workers_turns(
    chunks: Path, num_workers: int, batch_size: int
) -> None:
    """What resuming LitData's loader on another layout stands on (issue 55): the batches LitData's own loader hands
    out are computed from its plan without reading a sample (epochs 1 and 2, workers of unequal shares)."""
    from lightning_resumable.internals._litdata_plan import planned_batches

    for epoch in (1, 2):
        context = {"multiprocessing_context": "fork"} if num_workers else {}
        own = litdata.StreamingDataLoader(
            train.litdata_stream(chunks), batch_size=batch_size, num_workers=num_workers, **context
        )
        own.current_epoch = epoch - 1  # LitData adds 1 as the pass starts
        read = [batch[0].tolist() for batch in own]
        plan = planned_batches(
            train.litdata_stream(chunks),
            world_size=1,
            rank=0,
            num_workers=num_workers,
            batch_size=batch_size,
            epoch=epoch,
        )
        assert [[index for _, index in batch] for batch in plan] == read, epoch


def test_the_plans_of_a_layouts_ranks_share_out_the_epoch(chunks: Path) -> None:
    """Two ranks of 2 workers: every sample once (LitData drops what does not fill the ranks alike)."""
    from lightning_resumable.internals._litdata_plan import planned_batches

    dataset = train.litdata_stream(chunks)
    plans = [planned_batches(dataset, world_size=2, rank=rank, num_workers=2, batch_size=4, epoch=1) for rank in (0, 1)]
    samples = [index for plan in plans for batch in plan for _, index in batch]
    assert len(samples) == len(set(samples)) and len(plans[0]) == len(plans[1]) and len(samples) > 40


def test_a_combined_dataset_that_declares_an_order_is_refused_saying_why(chunks: Path) -> None:
    """docs/litdata.md: a ``StreamingDataset`` may declare the layout of its order (every epoch read in it on any
    layout, `tests/e2e/test_litdata.py`); a ``CombinedStreamingDataset`` read by LitData's loader keeps its own."""
    combined = litdata.CombinedStreamingDataset([train.litdata_stream(chunks), train.litdata_stream(chunks)], seed=5)
    combined.resumable_stream_order = (2, 0, 4)
    with pytest.raises(UnsupportedLoaderError, match="CombinedStreamingDataset's order is its own"):
        make_litdata_resumable(litdata.StreamingDataLoader(combined, batch_size=4), seed=3, epoch_source=lambda: 0)
    single = train.litdata_stream(chunks)
    single.resumable_stream_order = (2, 0)
    with pytest.raises(UnsupportedLoaderError, match=r"give \(world_size, num_workers, batch_size\)"):
        make_litdata_resumable(litdata.StreamingDataLoader(single, batch_size=4), seed=3, epoch_source=lambda: 0)


def test_an_order_declared_at_a_requeue_on_the_same_layout_ends_the_epoch_in_its_own_and_reads_on_in_the_declared(
    chunks: Path,
) -> None:
    """A run begun declaring nothing, requeued on the same layout (1 x 0 x 4) declaring another's (1 x 2 x 4): the
    interrupted epoch's rest is the run's own order (the state says so), each epoch after it the declared layout's,
    as that layout's own loader reads it."""
    epoch = [0]
    own = read(iter(loader(chunks, 0, epoch)), BATCHES)
    saving = loader(chunks, 0, epoch)
    read(iter(saving), 4)  # three trained, the next read ahead
    stream = train.litdata_stream(chunks)
    stream.resumable_stream_order = (1, 2, 4)
    declaring = make_litdata_resumable(
        litdata.StreamingDataLoader(stream, batch_size=4), seed=3, epoch_source=lambda: epoch[0]
    )
    declaring.resume_from(saving.state_after(3), 3)
    assert read(iter(declaring), BATCHES - 3) == own[3:]
    for each in (1, 2):
        epoch[0] = each
        declared = loader(chunks, 2, [each])
        expected = read(iter(declared), BATCHES)
        declared.retire_workers()
        assert read(iter(declaring), BATCHES) == expected != read(iter(loader(chunks, 0, [each])), BATCHES)


def test_a_run_on_the_declared_layout_over_several_nodes_reads_the_declared_order_not_its_nodes_own(
    chunks: Path,
) -> None:
    """LitData deals chunks by node (its node count: world size over the GPUs a node has), and a declared order is
    the declared layout's on one node, as any other layout reads it: a run of the declared layout (2 x 0 x 4) on 2
    nodes reads that order, not LitData's own 2-node one, or a requeue on any other layout would read epochs other
    than the uninterrupted run's."""
    from litdata.utilities.env import _DistributedEnv

    def rank_loader(rank: int, nodes: int, declares: bool, epoch: int) -> LitDataLoader:
        stream = train.litdata_stream(chunks)
        stream.distributed_env = _DistributedEnv(world_size=2, global_rank=rank, num_nodes=nodes)  # as detected
        if declares:
            stream.resumable_stream_order = (2, 0, 4)
        user = litdata.StreamingDataLoader(stream, batch_size=4)
        return make_litdata_resumable(user, seed=3, epoch_source=lambda: epoch, rank=rank, world_size=2)

    def epochs(nodes: int, declares: bool) -> list[list[str]]:
        return [read(iter(rank_loader(rank, nodes, declares, epoch))) for epoch in (0, 1) for rank in (0, 1)]

    on_one_node = epochs(1, False)
    assert epochs(2, True) == on_one_node != epochs(2, False)  # the nodes' own orders differ (here in epoch 1)


@pytest.mark.parametrize(
    ("seed_samples", "workers"), [(True, 0), (False, 0), (False, 1)], ids=["seeded", "not", "not, a spawned worker"]
)
def test_seed_samples_decides_whether_a_sample_draws_under_its_own_seed(
    chunks: Path, seed_samples: bool, workers: int
) -> None:
    """The callback's ``seed_samples`` reaches LitData's loader (it was seeded either way): ``False`` leaves torch's,
    Python's and NumPy's global generators as they stand, so a sample's draws follow them (here the main process's,
    or those torch gives a worker from it); ``True`` draws under the sample's own seed, whatever they were. A worker
    that was not forked unpickles the dataset seeded again with the same setting."""
    from lightning_resumable.readers.build import make_resumable

    def batches(global_seed: int) -> list[str]:
        seed_everything(global_seed, verbose=False)
        context = {"multiprocessing_context": "spawn"} if workers else {}
        user = litdata.StreamingDataLoader(train.litdata_stream(chunks), batch_size=4, num_workers=workers, **context)
        made = make_resumable(user, seed=3, num_replicas=1, rank=0, seed_samples=seed_samples)
        found = read(iter(made), 3)
        made.retire_workers()  # type: ignore[attr-defined]  # a LitDataLoader's
        return found

    assert (batches(1) == batches(2)) is seed_samples


@pytest.mark.parametrize("restore_globals", [True, False])
def test_restore_globals_decides_whether_the_generators_are_put_back_after_a_batch_read_here(
    chunks: Path, restore_globals: bool
) -> None:
    """Without workers, the global generators are put back after each batch only if asked: the callback does not ask
    when it reseeds every step (``seed_steps``), and putting Python's back costs tens of µs a batch."""
    import torch

    from lightning_resumable.readers.build import make_resumable

    user = litdata.StreamingDataLoader(train.litdata_stream(chunks), batch_size=4)
    made = make_resumable(user, seed=3, num_replicas=1, rank=0, restore_globals=restore_globals)
    torch.manual_seed(5)
    before = torch.get_rng_state()
    read(iter(made), 2)
    assert torch.equal(torch.get_rng_state(), before) is restore_globals
