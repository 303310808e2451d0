"""`lightning_resumable.readers.mosaic` against the installed MosaicML Streaming (CI's extras step; skipped
without it): the state at the trainer's count is Mosaic's own and resumes the epoch on any number of
workers, the next epoch is fresh, the private names the module reads are there, and a dataset that
Mosaic built for another world, or partitions by another batch size, is refused."""

from __future__ import annotations

import importlib.util
import itertools
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

from lightning_resumable import set_mosaic_environment
from lightning_resumable.errors import IncompatibleStateError, UnsupportedLoaderError
from lightning_resumable.format.envelope import StreamState
from lightning_resumable.readers.build import make_resumable

from .e2e import train
from .helpers import assert_reader_resumes_exactly

if importlib.util.find_spec("streaming") is None:
    pytest.skip("MosaicML Streaming is not installed", allow_module_level=True)

streaming = train.import_streaming()

from lightning_resumable.readers import mosaic as mosaic_reader  # noqa: E402
from lightning_resumable.readers.mosaic import MosaicLoader, make_mosaic_resumable, order_of, seen_world, shared_epoch  # noqa: E402

BATCHES = 12  # 48 samples in batches of 4, one process


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    train.clean_mosaic_memory()  # left by runs that ended without Mosaic's cleanup
    directory = tmp_path_factory.mktemp("mosaic") / "shards"
    train.write_mosaic(directory, 48)
    return directory


def loader(shards: Path, num_workers: int, epoch: list[int]) -> MosaicLoader:
    context = {"multiprocessing_context": "fork"} if num_workers else {}  # litdata.optimize, if run before, sets spawn
    user = streaming.StreamingDataLoader(
        train.mosaic_stream(shards, 4), batch_size=4, num_workers=num_workers, **context
    )
    return make_mosaic_resumable(user, seed=3, epoch_source=lambda: epoch[0], rank=0, world_size=1)


def pass_of(batches: Any, count: int = BATCHES) -> list[list[Any]]:
    """``count`` batches of a pass, as ids and augmentations, left unexhausted as Lightning leaves it."""
    return [[batch[0].tolist(), batch[1].tolist()] for batch in itertools.islice(batches, count)]


@pytest.mark.parametrize(("workers", "resume_workers"), [(0, 0), (2, 2), (2, 0)])
def test_a_resume_at_the_trainers_count_continues_the_epoch_and_the_next_one_is_fresh(
    shards: Path, workers: int, resume_workers: int
) -> None:
    state, expected = assert_reader_resumes_exactly(
        lambda epoch, num_workers: loader(shards, num_workers, epoch),
        stop=3,
        length=BATCHES,
        workers=(workers, resume_workers),
    )
    assert expected[0] != expected[1], "each epoch is shuffled anew"
    assert state["epoch"] == 1 and state["sample_in_epoch"] == 12  # Mosaic's own keys: the 3 trained batches


def test_the_order_computed_is_what_mosaics_first_pass_settles(shards: Path) -> None:
    dataset = train.mosaic_stream(shards, 4)
    assert seen_world(dataset) == (0, 1, 1)
    computed = order_of(dataset)
    next(iter(streaming.StreamingDataLoader(dataset, batch_size=4)))
    settled = streaming.StreamingDataset.state_dict(dataset, 0, True)
    assert computed == {key: settled[key] for key in computed}


def test_a_torch_dataloader_over_mosaics_dataset_is_read_through_mosaics_loader(shards: Path) -> None:
    user = DataLoader(train.mosaic_stream(shards, 4), batch_size=4, num_workers=0)
    made = make_resumable(user, seed=3, num_replicas=1, rank=0)
    assert isinstance(made, MosaicLoader) and made.batch_size == 4
    assert make_resumable(made, seed=3, num_replicas=1, rank=0) is made


def test_a_dataset_built_for_another_world_or_batch_size_is_refused(shards: Path) -> None:
    user = streaming.StreamingDataLoader(train.mosaic_stream(shards, 4), batch_size=4)
    with pytest.raises(
        UnsupportedLoaderError, match=r"built as rank 0 of 1 .* this is rank 1 of 2.*set_mosaic_environment"
    ):
        make_mosaic_resumable(user, seed=3, epoch_source=lambda: 0, rank=1, world_size=2)
    other = streaming.StreamingDataLoader(train.mosaic_stream(shards, 4), batch_size=8)
    with pytest.raises(
        UnsupportedLoaderError, match=r"StreamingDataset\(batch_size=4\) under a loader of batch_size=8"
    ):
        make_mosaic_resumable(other, seed=3, epoch_source=lambda: 0, rank=0, world_size=1)


def test_workers_kept_from_pass_to_pass_are_kept_and_share_the_passs_epoch(shards: Path) -> None:
    """``persistent_workers=True`` stays (exact: tests/e2e/test_mosaic.py), and the epoch each sample's seed is keyed
    by lives in shared memory, so a kept worker's copy of the dataset reads each pass's."""
    persistent = streaming.StreamingDataLoader(
        train.mosaic_stream(shards, 4), batch_size=4, num_workers=1, persistent_workers=True
    )
    kept = make_mosaic_resumable(persistent, seed=3, epoch_source=lambda: 5, rank=0, world_size=1)
    assert kept.persistent_workers
    iterator = iter(kept)
    next(iterator)
    epoch = shared_epoch(kept.dataset)
    assert epoch.is_shared() and int(epoch) == 5
    del iterator
    kept.retire_workers()


def test_set_mosaic_environment_gives_mosaic_the_trainers_world(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK"):
        monkeypatch.setenv(name, "0")  # recorded, so that the test's own values are taken out again
        monkeypatch.delenv(name)

    class Trainer:
        global_rank, world_size, local_rank, num_devices, node_rank = 3, 4, 1, 2, 1

    set_mosaic_environment(Trainer())
    world = streaming.base.world.World.detect()
    assert (world.rank, world.num_ranks, world.ranks_per_node, world.num_nodes) == (3, 4, 2, 2)


def test_mosaic_resumes_on_any_layout_from_the_samples_consumed(shards: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mosaic's one global count resumes on any world size, workers and batch size (issue 55): on another global batch
    the epoch goes on through the same sequence from the samples consumed, its length the batches before the resume
    and the rest's on this layout, and a save inside it counts on from there; a count the nodes do not divide is
    refused."""
    epoch = [0]
    fresh = loader(shards, 0, epoch)
    whole = [sample for batch in pass_of(iter(fresh)) for sample in batch[0]]
    order = {"num_canonical_nodes": 1, "shuffle_seed": 7, "initial_physical_nodes": 1}
    consumed = {"epoch": 0, "sample_in_epoch": 12, **order}  # 2 batches of 6 on one process
    saved = StreamState(1, 0, 2, 1, 0, True, False, [consumed], reader="mosaic", batch_size=6)
    reader = loader(shards, 0, epoch)
    assert reader.world_size_refusal(saved) is None  # its one global count, on any layout
    assert reader.state_for_rank(saved, 0, 1) == consumed
    assert len(reader) == 2 + 9, "the 2 batches before the resume, then 36 samples in batches of 4"
    reader.resume_from(consumed, 2)
    rest = pass_of(iter(reader), 9)
    assert [sample for batch in rest for sample in batch[0]] == whole[12:], "the same sequence, regrouped"
    assert reader.state_after(5)["sample_in_epoch"] == 12 + 3 * 4
    assert len(reader) == 11 and reader.counted_anew_at_epoch_end
    reader.count_anew()
    assert len(reader) == BATCHES, "the next epochs: Mosaic's own length"
    same = replace(saved, batches=3, batch_size=4)  # 3 batches of 4: this loader's global batch, no count of its own
    other = loader(shards, 0, epoch)
    other.state_for_rank(same, 0, 1)
    assert len(other) == BATCHES and not other.counted_anew_at_epoch_end
    monkeypatch.setattr(mosaic_reader, "seen_world", lambda dataset: (0, 1, 5))
    with pytest.raises(IncompatibleStateError, match="consumed 12 samples of epoch 0, which do not divide among"):
        loader(shards, 0, epoch).state_for_rank(saved, 0, 1)


def test_a_save_without_lightnings_look_ahead_reads_the_next_batch_and_hands_it_out_next(shards: Path) -> None:
    """Mosaic's loader has a length, so Lightning does not read ahead of it: the digest of the next batch
    is read at the save, the pass then hands that batch out, and a resume onto another order is told
    apart by it."""
    epoch = [0]
    expected = pass_of(iter(loader(shards, 0, epoch)))
    stopped = loader(shards, 0, epoch)
    batches = iter(stopped)
    seen = pass_of(batches, 3)  # 3 trained, none read ahead
    digest, state = stopped.next_batch_digest(3), stopped.state_after(3)
    assert digest != "" and seen + pass_of(batches, BATCHES - 3) == expected
    resumed = loader(shards, 0, epoch)
    resumed.resume_from({**state, "shuffle_seed": state["shuffle_seed"] + 1}, 3, digest)  # another order
    pass_of(iter(resumed), 1)
    assert resumed.first_batch is not None and resumed.first_batch[0] != resumed.first_batch[1]


def test_skipping_steps_of_mosaics_loader_is_refused_naming_it(shards: Path) -> None:
    """docs/long-runs.md: Mosaic's state is its count of samples, which a discard of batches would not move as its
    reading does; a skip is refused (`SkipError`) before any step."""
    from lightning_resumable import SkipError
    from lightning_resumable.lightning.stream_owner import StreamOwner

    owner = StreamOwner(loader(shards, 0, [0]), rank=0, world_size=1)
    with pytest.raises(SkipError, match="not supported for MosaicML Streaming's loader"):
        owner.set_holes(())


def test_the_tests_cleaning_of_mosaics_memory_keeps_everything_of_a_live_prefix() -> None:
    """`train.clean_mosaic_memory` removes what a run that ended left, never a live run's lock file: a lock file is
    open only while taken, and one removed between two takes let two workers hold Mosaic's barrier lock at once."""
    import tempfile

    shm, temporary = Path("/dev/shm"), Path(tempfile.gettempdir())
    live_block, live_lock = shm / "999998_locals", temporary / "999998_barrier_filelock"
    left_block, left_lock = shm / "999997_locals", temporary / "999997_barrier_filelock"
    for path in (live_block, live_lock, left_block, left_lock):
        path.write_bytes(b"x")
    try:
        with live_block.open("rb"):  # a live run holds its blocks, not its lock files
            train.clean_mosaic_memory()
            assert live_block.exists() and live_lock.exists(), "a live prefix is kept whole"
        assert not left_block.exists() and not left_lock.exists(), "what an ended run left is removed"
    finally:
        for path in (live_block, live_lock, left_block, left_lock):
            path.unlink(missing_ok=True)


@pytest.mark.parametrize("seed_samples", [True, False])
def test_seed_samples_decides_whether_a_sample_draws_under_its_own_seed(shards: Path, seed_samples: bool) -> None:
    """The callback's ``seed_samples`` reaches Mosaic's loader (it was seeded either way): ``False`` leaves the global
    generators as they stand, so a sample's draws follow them; ``True`` draws under the sample's own seed."""
    import torch

    def batches(global_seed: int) -> list[list[Any]]:
        torch.manual_seed(global_seed)
        user = streaming.StreamingDataLoader(train.mosaic_stream(shards, 4), batch_size=4)
        return pass_of(iter(make_resumable(user, seed=3, num_replicas=1, rank=0, seed_samples=seed_samples)), 3)

    assert (batches(1) == batches(2)) is seed_samples


@pytest.mark.parametrize("restore_globals", [True, False])
def test_restore_globals_decides_whether_the_generators_are_put_back_after_a_batch_read_here(
    shards: Path, restore_globals: bool
) -> None:
    """Without workers, the global generators are put back after each batch only if asked (the callback does not ask
    when it reseeds every step)."""
    import torch

    user = streaming.StreamingDataLoader(train.mosaic_stream(shards, 4), batch_size=4)
    made = make_resumable(user, seed=3, num_replicas=1, rank=0, restore_globals=restore_globals)
    torch.manual_seed(5)
    before = torch.get_rng_state()
    pass_of(iter(made), 2)
    assert torch.equal(torch.get_rng_state(), before) is restore_globals
