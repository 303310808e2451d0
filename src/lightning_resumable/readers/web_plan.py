"""A WebDataset pipeline read as a plan: its URLs, its splitters and shard shuffle, its sample shuffle's size,
and the stages before and after that shuffle, which `lightning_resumable.readers.web_dataset` runs around its
own reading of the shards.

Promise: `plan_of` takes the stages the library knows, each kept as WebDataset's own but ``.batched``, replaced by
`batched_as_read`: the same batches, each yielded as its last sample is read (WebDataset 1.0.2's reads the sample
after it first, which the reader's state would count as delivered: a resume one sample late). Refused, naming the
stage (`UnsupportedLoaderError`): a stage it does not know before the sample shuffle's place (resampled shards,
``with_epoch``/``repeat``), a cache (``cache_dir``: the shards are read here, not through it, and the cache would
stay empty), ``.unbatched`` (it holds a batch's samples the state counts as delivered), ``.batched`` of fewer
than one sample, ``select_files`` and ``rename_files``, or more than one sample shuffle.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import webdataset as wds
from webdataset import cache, compat, filters, shardlists, tariterators

from lightning_resumable.errors import UnsupportedLoaderError

__all__ = ["WebPlan", "apply", "batched_as_read", "plan_of", "sample_by_sample", "stage_name"]


@dataclass(frozen=True)
class WebPlan:
    """What a WebDataset pipeline reads and does: its URLs, whether it splits them by node and by worker
    and shuffles them, the sample shuffle's size (1: none), and its sample stages before and after it."""

    urls: tuple[str, ...]
    split_by_node: bool
    split_by_worker: bool
    shuffle_shards: bool
    buffer: int
    before: tuple[Any, ...]
    after: tuple[Any, ...]
    local_paths: bool = False
    """Samples of local files carry ``__local_path__`` (WebDataset's opener adds it; ``tarfile_to_samples`` not)."""


def stage_name(stage: Any) -> str:
    function = getattr(stage, "f", stage)
    return getattr(function, "__qualname__", type(stage).__qualname__)


def _is(stage: Any, function: Any) -> bool:
    return stage is function or getattr(stage, "f", None) is function


def plan_of(dataset: object) -> WebPlan:
    """The plan of a WebDataset pipeline.

    Raises:
        UnsupportedLoaderError: a stage this module cannot take over, named.
    """
    if not isinstance(dataset, wds.DataPipeline):
        raise UnsupportedLoaderError(f"{type(dataset).__name__} is not a WebDataset pipeline")
    if dataset.repetitions != 1 or dataset.nsamples > 0:
        raise UnsupportedLoaderError(
            "the WebDataset pipeline repeats or cuts its epoch (.repeat() or .with_epoch()): the library's epoch is"
            " one pass over the shards; remove it and set the epoch's length with Lightning's limit_train_batches"
        )
    stages = list(dataset.pipeline)
    source = stages.pop(0) if stages else None
    if not isinstance(source, shardlists.SimpleShardList):
        raise UnsupportedLoaderError(
            f"the WebDataset pipeline starts with {stage_name(source)}; the library takes over a list of shards"
            " (wds.WebDataset(urls) or wds.SimpleShardList(urls)); resampled shards have no pass to resume"
        )
    node = worker = shuffle_shards = False
    while stages and not _reads_tars(stages[0]):
        stage = stages.pop(0)
        if _is(stage, shardlists.split_by_node):
            node = True
        elif _is(stage, shardlists.split_by_worker):
            worker = True
        elif _is(stage, shardlists.single_node_only):
            continue  # WebDataset refuses several nodes then: so does the library (WebShards)
        elif _is(stage, filters.shuffle.f) or isinstance(stage, filters.detshuffle):
            shuffle_shards = _buffer_of(stage) > 1  # (shardshuffle=False appends a shuffle of 0: none)
        else:
            raise UnsupportedLoaderError(
                f"the WebDataset pipeline's stage {stage_name(stage)} comes before its shards are read; the library"
                " takes over split_by_node, split_by_worker and a shard shuffle there"
            )
    local_paths = False
    while stages and _reads_tars(stages[0]):
        stage = stages.pop(0)
        if isinstance(stage, cache.FileCache):
            raise UnsupportedLoaderError(
                "the WebDataset pipeline caches its shards (cache_dir, stage FileCache): the library reads the"
                " shards itself and would leave the cache empty; remove cache_dir (the shards are read where they"
                " are), or copy them to local disk first"
            )
        local_paths = local_paths or isinstance(stage, cache.StreamingOpen)
        if getattr(stage, "kw", {}).get("select_files") or getattr(stage, "kw", {}).get("rename_files"):
            raise UnsupportedLoaderError("WebDataset's select_files and rename_files are not taken over")
    if any(_is(stage, filters.unbatched.f) for stage in stages):
        raise UnsupportedLoaderError(
            "the WebDataset pipeline's stage _unbatched (.unbatched()) holds a batch's samples after it read them, so"
            " a save between them would resume past the rest; batch with the DataLoader's batch_size instead"
        )
    stages = [_taken_over(stage) for stage in stages]
    shuffles = [index for index, stage in enumerate(stages) if _is(stage, filters.shuffle.f)]
    if len(shuffles) > 1:
        raise UnsupportedLoaderError("the WebDataset pipeline shuffles its samples twice; keep one .shuffle(n)")
    buffer, place = 1, 0
    if shuffles:
        place = shuffles[0]
        buffer = _buffer_of(stages.pop(place))
    return WebPlan(
        urls=tuple(source.urls),
        split_by_node=node,
        split_by_worker=worker,
        shuffle_shards=shuffle_shards,
        buffer=max(buffer, 1),
        before=tuple(stages[:place]),
        after=tuple(stages[place:]),
        local_paths=local_paths,
    )


def _taken_over(stage: Any) -> Any:
    """``stage``, or for ``.batched`` the same batching without its read-ahead (`batched_as_read`).

    Raises:
        UnsupportedLoaderError: ``.batched`` of fewer than one sample.
    """
    if not _is(stage, filters.batched.f):
        return stage
    made = filters.FilterFunction(batched_as_read, *stage.args, **stage.kw)
    size = made.args[0] if made.args else made.kw.get("batchsize", 20)
    if size < 1:
        raise UnsupportedLoaderError(
            f"the WebDataset pipeline's .batched({size}) makes no batch of samples: give 1 or more"
        )
    return made


def batched_as_read(
    data: Iterator[Any],
    batchsize: int = 20,
    collation_fn: Any = filters.default_collation_fn,
    partial: bool = True,
) -> Iterator[Any]:
    """WebDataset's ``batched`` (the same batches, collation and last partial batch), each yielded as soon as its
    last sample is read, not after the next one is, so that what was read is what was yielded."""
    batch: list[Any] = []
    for sample in data:
        batch.append(sample)
        if len(batch) == batchsize:
            yield collation_fn(batch) if collation_fn is not None else batch
            batch = []
    if batch and partial:
        yield collation_fn(batch) if collation_fn is not None else batch


def _buffer_of(stage: Any) -> int:
    """A shuffle stage's buffer (``filters.shuffle(bufsize)`` or ``detshuffle``)."""
    if isinstance(stage, filters.detshuffle):
        return int(stage.bufsize)
    return int(stage.args[0] if stage.args else stage.kw.get("bufsize", 1000))


def _reads_tars(stage: Any) -> bool:
    """A stage of WebDataset's own reading of tar files: opening URLs, expanding tars, grouping files."""
    readers = (tariterators.tarfile_samples, tariterators.tar_file_expander, tariterators.group_by_keys)
    return (
        isinstance(stage, (cache.StreamingOpen, cache.FileCache))
        or _is(stage, tariterators.url_opener)
        or _is(stage, compat.check_empty)
        or any(_is(stage, reader) for reader in readers)
    )


def apply(stages: tuple[Any, ...], samples: Iterator[Any]) -> Iterator[Any]:
    for stage in stages:
        samples = stage.run(samples) if isinstance(stage, wds.PipelineStage) else stage(samples)
    return samples


_SAMPLE_BY_SAMPLE = (
    filters._map,
    filters._map_dict,
    filters._map_tuple,
    filters._to_tuple,
    filters._rename,
    filters._rename_keys,
)
"""WebDataset's stages that make at most one item of each sample (``.map``, ``.decode``, ``.to_tuple``...): one
may drop a sample (a map that returns ``None``, a handler that skips an error), none makes two or holds one."""


def sample_by_sample(stages: tuple[Any, ...]) -> bool:
    """Whether every one of ``stages`` makes at most one item of each sample (`_SAMPLE_BY_SAMPLE`), so that a sample
    can be made into its item apart from the others."""
    return all(isinstance(stage, filters.FilterFunction) and stage.f in _SAMPLE_BY_SAMPLE for stage in stages)
