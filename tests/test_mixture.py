"""A mixture's stream: equal to its replay at any position, each source without replacement within a
pass, epochs of whole global batches; its owner's resumes (unchanged, changed and scheduled weights,
sources added, removed and brought back, another world size) and refusals."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from lightning_resumable import (
    Chunked,
    IncompatibleStateError,
    Mixture,
    MixtureError,
    ResumableDataCallback,
    ResumableDataModule,
    UnsupportedLoaderError,
    WeightSchedule,
)
from lightning_resumable.core.chunks import Chunks
from lightning_resumable.core.mixture_sampler import MixtureSampler
from lightning_resumable.format.audit import read_audit
from lightning_resumable.readers.build import BuildOptions, build_resumable
from lightning_resumable.tools.summary import render, summarise

from .helpers import (
    SEED,
    SIZES,
    Model,
    SaveAtStep,
    drawn,
    in_stream_order,
    mixture,
    owner_for,
    read_epochs,
    replayed_mixture,
    resumed,
    save,
    trainer,
)

# ------------------------------------------------------------------------------------ the stream
weights_strategy = st.dictionaries(st.sampled_from(sorted(SIZES)), st.integers(0, 9), min_size=3).filter(
    lambda weights: sum(weights.values()) > 0
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 300), weights_strategy), max_size=3),
    weights_strategy,
    st.dictionaries(st.sampled_from(sorted(SIZES)), st.integers(1, 30), min_size=3),
    st.lists(st.integers(0, 399), min_size=1, max_size=20),
)
def test_any_position_draws_what_the_replay_draws(
    later: list[tuple[int, dict[str, int]]], first: dict[str, int], sizes: dict[str, int], positions: list[int]
) -> None:
    """Random weights, schedules (by samples) and source sizes: computed at any position, not replayed."""
    changes = [(0, first), *sorted(dict(later).items())]
    sampler = owner_for(mixture(WeightSchedule(dict(changes), unit="samples"), sizes)).sampler
    replay = replayed_mixture(sizes, SEED, changes, 400)
    indices = sampler.stream.indices(torch.tensor(positions)).tolist()
    assert [sampler.mixture.locate(index) for index in indices] == [replay[position] for position in positions]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 400), weights_strategy), max_size=4), weights_strategy)
def test_each_source_is_read_without_replacement_within_each_pass(
    later: list[tuple[int, dict[str, int]]], first: dict[str, int]
) -> None:
    sampler = owner_for(mixture(WeightSchedule({0: first, **dict(later)}, unit="samples"))).sampler
    draws = [sampler.mixture.locate(index) for index in sampler.stream.indices(torch.arange(600)).tolist()]
    for name, size in SIZES.items():
        sequence = [index for source, index in draws if source == name]
        for start in range(0, len(sequence), size):
            one_pass = sequence[start : start + size]
            assert len(set(one_pass)) == len(one_pass), f"{name} repeats a sample within a pass"
            if len(one_pass) == size:
                assert sorted(one_pass) == list(range(size)), f"{name} skips a sample in a pass"


def test_each_rank_reads_a_block_of_every_global_batch_and_every_window_is_in_proportion() -> None:
    weights = {"web": 5, "code": 3, "books": 2}
    samplers = [owner_for(mixture(weights, samples_per_epoch=400), 2, rank, batch_size=10).sampler for rank in range(2)]
    for sampler in samplers:
        sources = [name for name, _ in drawn(sampler, list(iter(sampler)))]
        for step in range(len(sources) // 10):
            counts = Counter(sources[step * 10 : (step + 1) * 10])
            assert all(abs(counts[name] - 10 * weight / 10) < 2 for name, weight in weights.items()), counts


def test_the_ranks_read_the_stream_in_whole_global_batches_across_epochs() -> None:
    mix = mixture({"web": 5, "code": 3, "books": 2}, samples_per_epoch=21)
    samplers = [owner_for(mix, world_size=2, rank=rank, batch_size=3).sampler for rank in range(2)]
    stream: list[tuple[str, int]] = []
    for epoch in range(3):
        per_rank = []
        for sampler in samplers:
            sampler.set_epoch(epoch)
            per_rank.append(drawn(sampler, list(iter(sampler))))
            assert len(sampler) == 12, "21 samples round up to 4 global batches of 6: 12 on each rank"
        stream += in_stream_order(per_rank, 3)
    assert stream == replayed_mixture(SIZES, SEED, [(0, {"web": 5, "code": 3, "books": 2})], 72)


def test_a_sample_is_seeded_by_its_stream_position() -> None:
    one = owner_for(mixture({"web": 1, "code": 1, "books": 1})).sampler
    two = [owner_for(mixture({"web": 1, "code": 1, "books": 1}), 2, rank).sampler for rank in range(2)]
    alone = [seed for _, seed in iter(one)]  # 25 samples: 28 on one process (7 steps of 4), 32 on two
    split = [seed for _, seed in in_stream_order([list(iter(each)) for each in two], 4)]
    assert (len(alone), len(split)) == (28, 32)
    assert alone == split[:28] and len(set(split)) == len(split)


def test_a_schedule_by_steps_switches_at_the_global_batch_that_starts_the_step() -> None:
    schedule = WeightSchedule({0: {"web": 1, "code": 0, "books": 0}, 3: {"web": 0, "code": 1, "books": 0}})
    mix = mixture(schedule, samples_per_epoch=40)
    sampler = owner_for(mix, world_size=2, batch_size=4).sampler
    sources = [name for name, _ in drawn(sampler, list(iter(sampler)))]
    assert sources == ["web"] * 12 + ["code"] * 8, "rank 0 of 2: 3 steps of 4 samples, then the code source"


def test_a_schedule_given_as_a_function_is_read_every_so_often() -> None:
    ramp = WeightSchedule(lambda step: {"web": 10 - min(step, 10), "code": min(step, 10), "books": 0}, every=5)
    sampler = owner_for(mixture(ramp, samples_per_epoch=80), batch_size=2).sampler
    counts = Counter(name for name, _ in drawn(sampler, list(iter(sampler)))[10:20])  # steps 5 to 9: 5:5
    assert counts == Counter({"web": 5, "code": 5})


# ---------------------------------------------------------------------------------------- resumes
def uninterrupted(mix: Mixture, epochs: int) -> list[tuple[str, int]]:
    owner = owner_for(mix)
    owner.start_fresh(0)
    return read_epochs(owner, epochs)


def stopped_and_resumed(before: Mixture, after: Mixture, batches: int, epochs: int) -> list[tuple[str, int]]:
    owner = owner_for(before)
    owner.start_fresh(0)
    sampler = owner.sampler
    start = drawn(sampler, list(iter(sampler)))[: batches * sampler.batch_size]
    return start + read_epochs(resumed(after, save(owner, batches)), epochs)


def test_unchanged_weights_resume_as_the_uninterrupted_run() -> None:
    weights = {"web": 5, "code": 3, "books": 2}
    expected = uninterrupted(mixture(weights, samples_per_epoch=30), 3)
    assert stopped_and_resumed(mixture(weights, samples_per_epoch=30), mixture(weights), 3, 3) == expected


def test_weights_changed_at_a_resume_equal_a_schedule_that_changes_there() -> None:
    old, new = {"web": 5, "code": 3, "books": 2}, {"web": 1, "code": 1, "books": 6}
    schedule = WeightSchedule({0: old, 3: new})  # 3 steps of 4 samples on one process: stream position 12
    expected = uninterrupted(mixture(schedule, samples_per_epoch=30), 3)
    assert stopped_and_resumed(mixture(old, samples_per_epoch=30), mixture(new), 3, 3) == expected


@pytest.mark.parametrize("stop", [2, 5], ids=["before-the-switch", "after-the-switch"])
def test_a_scheduled_change_resumes_exactly_from_either_side_of_it(stop: int) -> None:
    schedule = WeightSchedule({0: {"web": 5, "code": 3, "books": 2}, 4: {"web": 1, "code": 1, "books": 6}})
    expected = uninterrupted(mixture(schedule, samples_per_epoch=30), 3)
    got = stopped_and_resumed(mixture(schedule, samples_per_epoch=30), mixture(schedule), stop, 3)
    assert got == expected


def test_a_source_added_starts_its_first_pass_and_a_removed_one_comes_back_where_it_stopped() -> None:
    weights = {"web": 2, "code": 1, "books": 1}
    owner = owner_for(mixture(weights, samples_per_epoch=24))
    owner.start_fresh(0)
    books_read = [index for name, index in replayed_mixture(SIZES, SEED, [(0, weights)], 12) if name == "books"]
    without_books = {"web": 13, "code": 7, "news": 9}
    middle = resumed(mixture({"web": 2, "code": 1, "news": 1}, without_books), save(owner, 3))  # at position 12
    news = [index for name, index in read_epochs(middle, 2) if name == "news"]
    assert news == [index for _, index in replayed_mixture({"news": 9}, SEED, [(0, {"news": 1})], len(news))]
    middle = resumed(mixture({"web": 2, "code": 1, "news": 1}, without_books), save(owner, 3))
    list(iter(middle.sampler))
    kept = save(middle, 5).mixture  # at position 20
    assert kept.sizes == {**SIZES, "news": 9} and "books" not in kept.parts
    assert kept.counts["books"] == len(books_read), "a removed source keeps its count"
    back = resumed(mixture({"web": 0, "code": 0, "books": 1}), save(middle, 5))
    books = [index for _, index in read_epochs(back, 1)]
    replay = [index for _, index in replayed_mixture({"books": 5}, SEED, [(0, {"books": 1})], 20)]
    assert replay[: len(books_read)] == books_read
    assert books == replay[len(books_read) : len(books_read) + len(books)] and books, "its pass continues"


def test_a_resume_on_one_process_continues_the_stream_of_two() -> None:
    weights = {"web": 5, "code": 3, "books": 2}
    ranks = [owner_for(mixture(weights, samples_per_epoch=30), 2, rank) for rank in range(2)]
    for owner in ranks:
        owner.start_fresh(0)
    per_rank = [drawn(owner.sampler, list(iter(owner.sampler)))[:8] for owner in ranks]  # 2 steps of 4 on each
    trained = in_stream_order(per_rank, 4)
    owner = resumed(mixture(weights, samples_per_epoch=30), save(ranks[0], 2), world_size=1)
    sampler = owner.sampler
    assert sampler.stream_length == 32, "16 trained on two, the 14 left of 30 rounded up to 4 steps of 4 on one"
    assert len(sampler) == 2 * 4 + 16, "the trainer counts the 2 steps before the resume in their own units"
    assert trained + read_epochs(owner, 2) == replayed_mixture(SIZES, SEED, [(0, weights)], 16 + 16 + 32)


# --------------------------------------------------------------------------------------- refusals
def test_a_source_whose_size_changed_is_refused_by_name() -> None:
    owner = owner_for(mixture({"web": 1, "code": 1, "books": 1}))
    owner.start_fresh(0)
    with pytest.raises(IncompatibleStateError, match=r"the source 'code': size 7 in the checkpoint, 8 now"):
        resumed(mixture({"web": 1, "code": 1, "books": 1}, {**SIZES, "code": 8}), save(owner, 1))


@pytest.mark.parametrize(
    ("before", "after", "message"),
    [
        ([7], [4, 3], r"'code': read chunk by chunk \(chunks x window: 1x4:\w+\) in the checkpoint, chunk by chunk"),
        ([7], None, r"'code': read chunk by chunk .* in the checkpoint, by one permutation of its samples now"),
        (None, [4, 3], r"'code': read by one permutation of its samples in the checkpoint, chunk by chunk"),
    ],
    ids=["rechunked", "unchunked", "chunked"],
)
def test_a_source_whose_chunks_changed_is_refused_by_name(
    before: list[int] | None, after: list[int] | None, message: str
) -> None:
    """Its pass order depends on its chunks: another chunking would continue the pass in another order."""

    def with_code(sizes: list[int] | None) -> Mixture:
        code = list(range(7)) if sizes is None else Chunked(list(range(7)), sizes)
        return Mixture({"web": list(range(13)), "code": code}, {"web": 1, "code": 1})

    owner = owner_for(with_code(before))
    owner.start_fresh(0)
    saved = save(owner, 1)
    assert saved.mixture.chunks == ({} if before is None else {"code": Chunks(tuple(before)).digest()})
    with pytest.raises(IncompatibleStateError, match=message):
        resumed(with_code(after), saved)


@pytest.mark.parametrize(
    ("options", "message"),
    [({"samples_per_epoch": 99}, "samples_per_epoch: 25 in the checkpoint, 99 now"), ({"shuffle": False}, "shuffle")],
)
def test_another_epoch_length_or_shuffle_is_refused(options: dict[str, Any], message: str) -> None:
    owner = owner_for(mixture({"web": 1, "code": 1, "books": 1}))
    owner.start_fresh(0)
    with pytest.raises(IncompatibleStateError, match=message):
        resumed(mixture({"web": 1, "code": 1, "books": 1}, **options), save(owner, 1))


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ({"web": 1, "code": 1}, r"no weight for \['books'\]"),
        ({"web": 1, "code": 1, "books": 1, "news": 1}, r"\['news'\], which the mixture does not hold"),
        ({"web": 0, "code": 0, "books": 0}, "positive weight"),
        ({"web": -1, "code": 1, "books": 1}, "negative"),
    ],
)
def test_malformed_weights_are_refused_when_the_mixture_is_made(weights: dict[str, int], message: str) -> None:
    with pytest.raises(MixtureError, match=message):
        mixture(weights)


def test_a_schedule_must_start_at_zero_and_a_function_needs_every() -> None:
    with pytest.raises(MixtureError, match="from 0"):
        WeightSchedule({5: {"web": 1}})
    with pytest.raises(MixtureError, match="every="):
        WeightSchedule(lambda step: {"web": 1})


def test_a_loader_with_an_order_of_its_own_is_refused() -> None:
    mix = mixture({"web": 1, "code": 1, "books": 1})
    with pytest.raises(UnsupportedLoaderError, match="leave sampler, batch_sampler and shuffle unset"):
        build_resumable(DataLoader(mix, batch_size=2, sampler=list(range(10))), BuildOptions(SEED, 1, 0))


# ----------------------------------------------------------------------------------------- tools
class MixtureData(ResumableDataModule, L.LightningDataModule):
    """One-process training on a mixture of ``(tensor([id]),)`` samples (source ``code``'s ids from 100)."""

    def __init__(self, weights: Any) -> None:
        super().__init__()
        self.weights = weights

    def train_dataloader(self) -> DataLoader[Any]:
        sources = {
            "web": [(torch.tensor([float(i)]),) for i in range(13)],
            "code": [(torch.tensor([100.0 + i]),) for i in range(7)],
        }
        return DataLoader(Mixture(sources, self.weights, samples_per_epoch=16), batch_size=2)


def test_the_audit_log_names_each_samples_source(tmp_path: Path) -> None:
    weights = {"web": 3, "code": 1}
    callback = ResumableDataCallback(audit_dir=str(tmp_path / "audit"))
    fitted = trainer(tmp_path, [callback], max_epochs=2)
    fitted.fit(Model(), MixtureData(weights))
    steps = read_audit(tmp_path / "audit")[0]
    logged = [tuple(sample) for step in steps for sample in step["ids"]]
    assert logged == replayed_mixture({"web": 13, "code": 7}, callback.shuffle_seed(fitted), [(0, weights)], 32)


def test_inspect_shows_each_sources_weight_pass_and_position(tmp_path: Path) -> None:
    path = tmp_path / "mid.ckpt"
    trainer(tmp_path, [ResumableDataCallback(), SaveAtStep(10, path)], max_epochs=2).fit(
        Model(), MixtureData({"web": 3, "code": 1})
    )
    checkpoint = torch.load(path, weights_only=True)
    summary = summarise(checkpoint["callbacks"]["ResumableDataCallback"], checkpoint)
    train = summary["loaders"]["train"]
    assert train["kind"] == "mixture" and train["stream_position"] == 20 and train["steps"] == 10
    assert train["sources"] == {
        "code": {"weight": 0.25, "parts": "1/4", "size": 7, "drawn": 5, "pass": 0, "position": 5},
        "web": {"weight": 0.75, "parts": "3/4", "size": 13, "drawn": 15, "pass": 1, "position": 2},
    }
    shown = render(path, summary)
    assert re.search(r"source 'web' +weight 0\.75 \(3/4\), pass 1, 2 of 13 read", shown), shown


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 20), weights_strategy), max_size=3),
    weights_strategy,
    st.integers(0, 24),
    st.sampled_from([1, 2]),
)
def test_a_restore_at_any_step_reads_on_as_the_replay(
    later: list[tuple[int, dict[str, int]]], first: dict[str, int], stop: int, world_size: int
) -> None:
    """Random schedules by steps, a save after any number of steps on 1 or 2 processes, a resume on one."""
    schedule = WeightSchedule({0: first, **dict(later)})
    ranks = [owner_for(mixture(schedule, samples_per_epoch=48), world_size, rank) for rank in range(world_size)]
    for owner in ranks:
        owner.start_fresh(0)
    epoch_steps = len(ranks[0].sampler) // 4
    before = in_stream_order([drawn(owner.sampler, list(iter(owner.sampler))) for owner in ranks], 4)
    ranks[0].sampler.set_epoch(stop // epoch_steps)
    owner = resumed(mixture(schedule), save(ranks[0], stop % epoch_steps))
    after = read_epochs(owner, 2)
    changes = [
        (step * 4 * world_size if step <= stop else stop * 4 * world_size + (step - stop) * 4, weights)
        for step, weights in sorted({0: first, **dict(later)}.items())
    ]
    replay = replayed_mixture(SIZES, SEED, changes, stop * 4 * world_size + len(after))
    assert before[: stop * 4 * world_size][: len(replay)] == replay[: min(len(before), stop * 4 * world_size)]
    assert after == replay[stop * 4 * world_size :]


def test_a_loader_built_again_each_epoch_continues_the_stream_a_resume_changed(tmp_path: Path) -> None:
    """After a resume with new weights, each epoch's new loader goes on with them (a fresh one would not)."""
    first, later = {"web": 3, "code": 1}, {"web": 1, "code": 3}
    path = tmp_path / "stopped.ckpt"
    stopped, callback = Model(), ResumableDataCallback()
    trainer(tmp_path / "stop", [callback, SaveAtStep(5, path)], max_epochs=1).fit(stopped, MixtureData(first))
    resumed_model = Model()
    options = {"max_epochs": 3, "reload_dataloaders_every_n_epochs": 1}
    trainer(tmp_path / "resume", [ResumableDataCallback()], **options).fit(
        resumed_model, MixtureData(later), ckpt_path=path
    )
    seen = [value for step in stopped.seen[:5] + resumed_model.seen for value in step]
    replay = replayed_mixture({"web": 13, "code": 7}, callback.shuffle_seed(None), [(0, first), (10, later)], 48)  # type: ignore[arg-type]
    assert seen == [float(index + (100 if name == "code" else 0)) for name, index in replay]


def test_a_mixture_restored_at_an_epochs_start_reads_the_epoch_again_in_a_second_pass() -> None:
    """Lightning's reload of a train loader iterates it before ``set_epoch`` and again when the epoch runs;
    workers' prefetch can read a short epoch to its end in between. The pass that follows the restored
    one reads the epoch (found by tests/e2e: an elastic 1 -> 2 resume with workers trained no batch of
    the next epoch)."""
    mixture = Mixture({"a": list(range(10)), "b": list(range(5))}, {"a": 2, "b": 1})
    sampler = MixtureSampler(mixture, num_replicas=2, rank=1, seed=4, batch_size=2)
    sampler.set_epoch(2)
    carried = sampler.state_at_start(2, 0)
    rebuilt = MixtureSampler(mixture, num_replicas=2, rank=1, seed=4, batch_size=2)
    rebuilt.start_at(2, sampler.epoch_start(2), sampler.stream)
    rebuilt.restore(carried)
    discarded = list(rebuilt)  # Lightning's first iter(), read to its end by the workers' prefetch
    rebuilt.set_epoch(2)
    assert list(rebuilt) == discarded == list(sampler) and len(discarded) == 8
