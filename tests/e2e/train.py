"""One training run of the end-to-end suite: ``python train.py CONFIG.json``.

Lightning's DDP launcher starts the other ranks by re-running this command, so the whole run is
described by the config file. Each rank appends one JSON line per completed training step
(epoch, batch index, sample ids, each sample's augmentation values, the loss) to
``{out_dir}/{phase}.rank{R}.jsonl``, flushed at once, so the records survive the abrupt end of a
stopped run. Floats are written with ``repr``, so equal records mean bit-identical values.

The dataset draws its augmentation the way augmentation libraries do (``torch.rand``,
``random.random``, ``numpy.random.rand``), the model has dropout, and the trainer runs with
``deterministic=True``: two uninterrupted runs are bit-identical.

Phases: ``full`` trains straight through; ``stop`` saves a checkpoint at the configured point and
ends the process at once with ``os._exit`` (no cleanup, no exception handling, like a kill);
``resume`` trains from that checkpoint to the end.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import multiprocessing
import multiprocessing.process
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import types
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint, OnExceptionCheckpoint
from lightning.pytorch.utilities import CombinedLoader
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
    get_worker_info,
)
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_resumable import (
    Mixture,
    ResumableBatchSampler,
    ResumableDataCallback,
    ResumableDataModule,
    WeightSchedule,
)
from lightning_resumable.readers.workers import garbage_collector_paused

try:  # imported as tests.e2e.train (the unit tests of the data libraries build their data with it)
    from .data_setups import COMBINED_SIZES, MIXTURE_OFFSETS, SETUPS, STREAM_SIZE
except ImportError:  # run as a script, or by the fork server: tests/e2e is on the path
    from data_setups import COMBINED_SIZES, MIXTURE_OFFSETS, SETUPS, STREAM_SIZE  # type: ignore[no-redef]

warnings.filterwarnings("ignore", category=UserWarning)


class IdDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Sample ``i`` carries its own id and three random 'augmentation' values, one per global generator.

    ``relisted`` reads the rows in another order, as a dataset whose files were listed anew would.
    """

    def __init__(self, size: int, relisted: bool = False) -> None:
        self.size = size
        self.relisted = relisted

    def __len__(self) -> int:
        return self.size

    level = 0  # raised by a curriculum; a plain IdDataset stays at 0

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = (index + 1) % self.size if self.relisted else index
        augmentation = [torch.rand(()).item(), random.random(), float(np.random.rand())]
        return torch.tensor(index), torch.tensor([float(row % 7 + 10 * self.level), *augmentation])


OUT_OF_REACH = np.random.default_rng(11)
"""A generator no dataset attribute reaches: each worker's copy advances with its samples."""


class AugmentedImages(IdDataset):
    """uint8 images augmented in ``__getitem__`` by what ``augment`` names, each sample's values its id's
    row and three statistics of the augmented pixels (their mean, a position-weighted sum, a deviation).

    ``albumentations`` and ``albumentations-seeded``: a ``Compose`` (``seed=None`` and ``seed=42``), which
    draws from generators of its own; ``own-generator``: noise from a ``torch.Generator`` the dataset
    holds; ``kornia``: kornia's augmentations, which draw from torch's global generator;
    ``out-of-reach``: noise from a module-level generator, which the library cannot reseed.
    """

    def __init__(self, size: int, augment: str) -> None:
        super().__init__(size)
        self.images = np.random.default_rng(17).integers(0, 256, (size, 16, 16, 3), dtype=np.uint8)
        self.augment = augment
        if augment.startswith("albumentations"):
            import albumentations as A

            steps = [A.RandomCrop(12, 12), A.HorizontalFlip(p=0.5), A.RandomBrightnessContrast(p=1.0)]
            steps.append(A.GaussNoise(p=1.0))
            self.transform = A.Compose(steps, seed=42 if augment == "albumentations-seeded" else None)
        elif augment == "own-generator":
            self.generator = torch.Generator().manual_seed(3)
        elif augment == "kornia":
            import kornia.augmentation as K

            self.transform = K.AugmentationSequential(
                K.RandomCrop((12, 12)), K.RandomHorizontalFlip(), K.ColorJitter(0.2, 0.2, p=1.0)
            )
        elif augment != "out-of-reach":
            raise ValueError(f"no augmentation {augment!r}")

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.images[index]
        if self.augment.startswith("albumentations"):
            pixels = torch.from_numpy(self.transform(image=image)["image"]).float() / 255
        elif self.augment == "own-generator":
            pixels = torch.from_numpy(image).float() / 255 + torch.rand(image.shape, generator=self.generator)
        elif self.augment == "out-of-reach":
            pixels = torch.from_numpy(image / 255 + OUT_OF_REACH.random(image.shape)).float()
        else:
            pixels = self.transform(torch.from_numpy(image).permute(2, 0, 1).float()[None] / 255)[0]
        weights = torch.arange(pixels.numel(), dtype=torch.float64).reshape(pixels.shape) / pixels.numel()
        stats = [pixels.mean().item(), (pixels.double() * weights).mean().item(), pixels.std().item()]
        return torch.tensor(index), torch.tensor([float(index % 7), *stats])


class OffsetDataset(IdDataset):
    """An IdDataset whose ids start at ``offset``: the second loader of the ``combined`` data."""

    def __init__(self, size: int, offset: int) -> None:
        super().__init__(size)
        self.offset = offset

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        sample_id, values = super().__getitem__(index)
        return sample_id + self.offset, values


def augmented(sample_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    augmentation = [torch.rand(()).item(), random.random(), float(np.random.rand())]
    return torch.tensor(sample_id), torch.tensor([float(sample_id % 7), *augmentation])


class ShardedStream(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """A user's stateful stream: rank ``r`` of ``W`` reads ids ``r, r + W, ...``, each worker every
    ``num_workers``-th of those, reshuffled each pass by ``(1000 + epoch)``. Its state (one per worker
    copy) is the epoch, the shard it reads (the rank's, as a file reader names its file) and the id it
    read last, a cursor as a file offset would be. A copy restored with another rank's state reads that
    rank's shard on from its cursor, as a file reader would, without an error."""

    def __init__(self, size: int, rank: int, world_size: int) -> None:
        self.size, self.rank, self.world_size = size, rank, world_size
        self.epoch, self.last_id, self._resume_after = 0, -1, -1

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self._resume_after = epoch, -1

    def __iter__(self) -> Any:
        worker = get_worker_info()
        worker_id, workers = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        mine = list(range(self.rank, self.size, self.world_size))[worker_id::workers]
        order = torch.randperm(len(mine), generator=torch.Generator().manual_seed(1000 + self.epoch)).tolist()
        ids = [mine[position] for position in order]
        start = 0 if self._resume_after < 0 else ids.index(self._resume_after) + 1  # ValueError: not mine
        self._resume_after, self.last_id = -1, ids[start - 1] if start else -1
        for sample_id in ids[start:]:
            self.last_id = sample_id
            yield augmented(sample_id)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "shard": self.rank, "last_id": self.last_id}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.rank, self._resume_after = state["epoch"], state["shard"], state["last_id"]
        self.last_id = self._resume_after  # the state until the next sample is read


def hf_rows(rows_per_shard: int, shards: list[int], first: int = 0) -> Any:
    for shard in shards:
        for row in range(rows_per_shard):
            yield {"id": first + shard * rows_per_shard + row}


def hf_augment(example: dict[str, Any]) -> dict[str, Any]:
    sample_id, values = augmented(example["id"])
    return {"id": int(sample_id), "x": values.tolist()}


def hf_arrow_stream(size: int, rank: int, world_size: int, shuffle_buffer: int) -> Any:
    """A Hugging Face stream whose chain reads Arrow tables and draws nothing (the library reads its windows as
    Arrow): 8 shards of a ``Dataset``'s rows, shuffled, torch-formatted and split by node; augmented in the collate
    (`hf_arrow_collate`)."""
    from datasets import Dataset
    from datasets.distributed import split_dataset_by_node

    stream = Dataset.from_dict({"id": list(range(size))}).to_iterable_dataset(num_shards=8)
    stream = stream.shuffle(seed=7, buffer_size=shuffle_buffer).with_format("torch")
    return split_dataset_by_node(stream, rank=rank, world_size=world_size)


def hf_arrow_collate(rows: list[dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row augmented here, after the batch's last sample was read: drawn from the generators that sample's
    seed left (in a worker, or in the rank with none)."""
    ids, values = zip(*(augmented(int(row["id"])) for row in rows), strict=True)
    return torch.stack(ids), torch.stack(values)


def hf_stream(size: int, rank: int, world_size: int, shuffle_buffer: int = 0) -> Any:
    """A Hugging Face ``datasets.IterableDataset`` from a generator over 8 local shards, augmented in
    ``map`` and split by node; nothing comes from the hub."""
    from datasets import IterableDataset as HFIterableDataset
    from datasets.distributed import split_dataset_by_node

    rows_per_shard = size // 8
    rows = functools.partial(hf_rows, rows_per_shard)  # module-level: pickled for workers started by spawn
    stream = HFIterableDataset.from_generator(rows, gen_kwargs={"shards": list(range(8))}).map(hf_augment)
    if shuffle_buffer:
        stream = stream.shuffle(seed=7, buffer_size=shuffle_buffer)
    return split_dataset_by_node(stream, rank=rank, world_size=world_size)


def hf_interleaved_stream(size: int, rank: int, world_size: int, shuffle_buffer: int) -> Any:
    """Two Hugging Face streams of ``size // 2`` rows each (8 shards; ids from 0 and from ``size // 2``), each shuffled
    through a buffer, interleaved in turn until both are read (``interleave_datasets``, ``all_exhausted``: every
    epoch ``size`` rows), augmented in ``map`` after it and split by node."""
    import datasets
    from datasets import IterableDataset as HFIterableDataset
    from datasets.distributed import split_dataset_by_node

    half = size // 2
    sources = [
        HFIterableDataset.from_generator(
            functools.partial(hf_rows, half // 8, first=first), gen_kwargs={"shards": list(range(8))}
        ).shuffle(seed=seed, buffer_size=shuffle_buffer or 4)
        for seed, first in ((3, 0), (4, half))
    ]
    mixed = datasets.interleave_datasets(sources, seed=9, stopping_strategy="all_exhausted").map(hf_augment)
    return split_dataset_by_node(mixed, rank=rank, world_size=world_size)


WDS_DIR = "wds-shards"
"""Where a runner's WebDataset scenarios read their tar shards: beside its run directories (`wds_shards`)."""


def wds_shards(root: Path, size: int) -> list[str]:
    """8 tar shards of ``size // 8`` samples (a text id each), written with WebDataset's ``ShardWriter`` beside
    the runs, once: each process that finds none writes its own and renames it into place (the same bytes)."""
    import shutil

    import webdataset as wds

    directory = root / WDS_DIR
    if not directory.exists():
        staging = root / f"{WDS_DIR}.{os.getpid()}"
        staging.mkdir(parents=True, exist_ok=True)
        with wds.ShardWriter(str(staging / "shard-%02d.tar"), maxcount=size // 8, verbose=0) as sink:
            for sample_id in range(size):
                sink.write({"__key__": f"sample{sample_id:04d}", "txt": str(sample_id)})
        try:
            staging.rename(directory)
        except OSError:  # another process's came first
            shutil.rmtree(staging)
    return sorted(str(path) for path in directory.glob("shard-*.tar"))


def wds_augmented(sample: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    return augmented(int(sample["txt"]))


def wds_tuple_augmented(sample: tuple[str]) -> tuple[torch.Tensor, torch.Tensor]:
    return augmented(int(sample[0]))


WDS_FORMS = ("", "batched-after", "batched-before", "web-loader")
"""The WebDataset pipelines the docs list as exact (issue 53): ``""`` a ``WebDataset`` shuffled, decoded and mapped,
batched by the loader; ``batched-after`` a ``DataPipeline`` (the stages listed one by one, ``to_tuple`` and
``.batched`` after the shuffle); ``batched-before`` a ``WebDataset`` batched before its shuffle (batches shuffled);
``web-loader`` the first batched after the shuffle in a ``WebLoader``. Batched in the pipeline: ``batch_size=None``."""


WDS_REFUSED = {
    "resampled": "resampled shards",
    "repeat": "repeats or cuts its epoch",
    "with_epoch": "repeats or cuts its epoch",
    "cache_dir": "cache_dir",
    "two_shuffles": "shuffles its samples twice",
    "select_files": "select_files",
    "rename_files": "rename_files",
    "web_loader_stages": "WebLoader has stages of its own",
    "no_node_splitter": "no node splitter",
    "unbatched": ".unbatched()",
}
"""The stages docs/streams-and-loaders.md lists as refused (`wds_refused`), each with what its refusal says."""


def every_file(name: str) -> bool:
    return True


def same_name(name: str) -> str:
    return name


def wds_refused(root: Path, size: int, buffer: int, refused: str, batch_size: int) -> Any:
    """A `wds_stream` with the stage ``refused`` (`WDS_REFUSED`): the loader (or dataset) a user would return."""
    import webdataset as wds

    urls = wds_shards(root, size)
    options: dict[str, Any] = dict(shardshuffle=len(urls), nodesplitter=wds.split_by_node, seed=0, empty_check=False)
    if refused == "resampled":
        options.update(resampled=True, shardshuffle=False)
    elif refused == "cache_dir":
        (root / "wds-cache").mkdir(exist_ok=True)  # WebDataset requires it to exist
        options["cache_dir"] = str(root / "wds-cache")
    elif refused == "select_files":
        options["select_files"] = every_file
    elif refused == "rename_files":
        options["rename_files"] = same_name
    elif refused == "no_node_splitter":
        del options["nodesplitter"]
    mapped = wds.WebDataset(urls, **options).shuffle(buffer).decode().map(wds_augmented)
    if refused == "repeat":
        return mapped.repeat(2)
    if refused == "with_epoch":
        return mapped.with_epoch(10)
    if refused == "two_shuffles":
        return mapped.shuffle(3)
    if refused == "unbatched":
        return mapped.batched(batch_size).unbatched()
    if refused == "web_loader_stages":
        return wds.WebLoader(mapped.batched(batch_size), batch_size=None).shuffle(8)
    return mapped


def wds_stream(root: Path, size: int, buffer: int, form: str = "", batch_size: int = 4) -> Any:
    """A WebDataset pipeline over `wds_shards` (`WDS_FORMS`), split by node, its samples shuffled through a buffer of
    ``buffer`` (its shards too, but for ``batched-after``), decoded and augmented in ``map``."""
    import webdataset as wds

    urls = wds_shards(root, size)
    if form == "batched-after":
        return wds.DataPipeline(
            wds.SimpleShardList(urls),
            wds.split_by_node,
            wds.split_by_worker,
            wds.tarfile_to_samples(),
            wds.shuffle(buffer),
            wds.decode(),
            wds.to_tuple("txt"),
            wds.map(wds_tuple_augmented),
            wds.batched(batch_size),
        )
    dataset = wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.split_by_node, seed=0, empty_check=False)
    if form == "batched-before":
        return dataset.decode().map(wds_augmented).batched(batch_size).shuffle(buffer)
    mapped = dataset.shuffle(buffer).decode().map(wds_augmented)
    return mapped.batched(batch_size) if form == "web-loader" else mapped


LITDATA_DIR = "litdata-chunks"
"""Where a runner's LitData scenarios read their chunks: beside its run directories (`write_litdata`)."""
LITDATA_SECOND_DIR = "litdata-chunks-second"
"""The second stream of the ``litdata-combined`` scenarios: ids 1000 to 1023."""


def litdata_row(sample_id: int) -> dict[str, int]:
    return {"id": sample_id}


@contextmanager
def start_method_kept() -> Iterator[None]:
    """The process's default start method as it was before (``litdata.optimize`` sets spawn for the whole process:
    every later loader of a test process started its workers by spawn, where its tests expected a fork)."""
    before = multiprocessing.get_start_method(allow_none=True)
    try:
        yield
    finally:
        multiprocessing.set_start_method(before, force=True)


def write_litdata(directory: Path, size: int, first: int = 0, chunk_size: int = 6) -> None:
    """Write ids ``first..first+size-1`` as LitData chunks of ``chunk_size`` samples (8 chunks of 6 for 48),
    with ``litdata.optimize``."""
    import litdata

    inputs = list(range(first, first + size))
    with start_method_kept():
        litdata.optimize(fn=litdata_row, inputs=inputs, output_dir=str(directory), chunk_size=chunk_size, num_workers=1)
    written = json.loads((directory / "index.json").read_text())["chunks"]  # a failed worker leaves it empty
    if sum(chunk["chunk_size"] for chunk in written) != size:
        raise RuntimeError(f"litdata.optimize wrote {written!r:.300} to {directory}, not {size} samples")


def litdata_stream(directory: Path) -> Any:
    """A LitData ``StreamingDataset`` over the chunks in ``directory``, shuffled, each sample augmented in
    ``__getitem__`` (LitData's documented way to transform), as a user's subclass does."""
    augmenting = augmenting_subclass("LitdataAugmented")
    return augmenting(str(directory), shuffle=True, seed=7, drop_last=True)  # LitData's default on several processes


def augmenting_subclass(name: str) -> Any:
    """A user's subclass of a data library's ``StreamingDataset`` (``LitdataAugmented``, ``MosaicAugmented``), each
    sample augmented in ``__getitem__`` (the libraries' documented way to transform). Made on first use (the
    libraries are imported lazily) at this module's top level, where pickle finds it by its name (`__getattr__`)
    in a loader worker that was not forked."""
    made = globals().get(name)
    if made is None:
        if name == "MosaicAugmented":
            base = import_streaming().StreamingDataset
        else:
            from litdata import StreamingDataset as base

        def __getitem__(self: Any, index: Any) -> Any:
            item = base.__getitem__(self, index)
            return augmented(int(item["id"]) if isinstance(item, dict) else int(item[0]))  # a row, or a token block

        made = type(name, (base,), {"__getitem__": __getitem__, "__module__": __name__, "__qualname__": name})
        globals()[name] = made
    return made


def __getattr__(name: str) -> Any:
    """A class `augmenting_subclass` makes, found by its name (unpickled in a worker started by spawn or forkserver)."""
    if name in ("LitdataAugmented", "MosaicAugmented"):
        return augmenting_subclass(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


SHARDED_DIR = "sharded"
"""The sources of a ``sharded-mixture`` scenario, one directory each by name, beside a runner's run directories:
``a`` and ``d`` LitData chunks, ``b`` LitData token blocks (``TokensLoader``), ``c`` MosaicML Streaming shards."""
SHARDED_SOURCES = {"a": (19, "litdata"), "b": (11, "tokens"), "c": (7, "mosaic"), "d": (13, "litdata")}
"""Each sharded source's size and kind; ids start at `MIXTURE_OFFSETS` (chunks of 3 samples or blocks, shards of 2)."""
TOKEN_BLOCK = 4


def token_block(sample_id: int) -> torch.Tensor:
    """One input of a token source: a block of `TOKEN_BLOCK` tokens, each the sample's id."""
    return torch.full((TOKEN_BLOCK,), sample_id, dtype=torch.int32)


def write_sharded_sources(root: Path) -> None:
    """Write every `SHARDED_SOURCES` source under ``root / SHARDED_DIR`` (once)."""
    import litdata

    for name, (size, kind) in SHARDED_SOURCES.items():
        directory, first = root / SHARDED_DIR / name, MIXTURE_OFFSETS[name]
        if (directory / "index.json").exists():
            continue
        if kind == "mosaic":
            write_mosaic(directory, size, first=first, per_shard=2)
        elif kind == "tokens":
            inputs = list(range(first, first + size))
            item_loader = litdata.TokensLoader()
            with start_method_kept():
                litdata.optimize(
                    fn=token_block,
                    inputs=inputs,
                    output_dir=str(directory),
                    chunk_size=3 * TOKEN_BLOCK,
                    num_workers=1,
                    item_loader=item_loader,
                )
        else:
            write_litdata(directory, size, first=first, chunk_size=3)


def sharded_source(root: Path, name: str) -> Any:
    """The sharded source ``name``: a LitData or Mosaic ``StreamingDataset`` (a user's subclass), each
    sample augmented in ``__getitem__``."""
    kind = SHARDED_SOURCES[name][1]
    directory = str(root / SHARDED_DIR / name)
    if kind == "mosaic":
        with one_mosaic_registration_at_a_time():
            return augmenting_subclass("MosaicAugmented")(local=directory, shuffle=False, batch_size=1)
    from litdata import TokensLoader

    loader = {"item_loader": TokensLoader(block_size=TOKEN_BLOCK)} if kind == "tokens" else {}
    return augmenting_subclass("LitdataAugmented")(directory, shuffle=True, seed=7, **loader)


def import_streaming() -> Any:
    """MosaicML Streaming, imported in the CPU test environment, which has no torchvision.

    ``import streaming`` imports ``streaming.vision``, which imports three names from torchvision. PyPI's
    torchvision pulls a CUDA build of torch and fails to import beside the CPU build, so CI's extras
    step installs Mosaic without it (``.ci/extras``). Where torchvision is missing, stand-ins for those
    names are put in ``sys.modules`` for the import only and taken out again: other packages
    (torchmetrics, which Lightning imports) look for torchvision and must not find them. These tests
    decode no image; using a stand-in raises.
    """
    if "streaming" in sys.modules or importlib.util.find_spec("torchvision") is not None:
        import streaming

        return streaming

    def unavailable(*args: object, **kwargs: object) -> Any:
        raise RuntimeError("torchvision is a test stand-in here: install torchvision to decode images")

    names = ("torchvision", "torchvision.datasets", "torchvision.transforms", "torchvision.transforms.functional")
    stand_ins = {name: types.ModuleType(name) for name in names}
    stand_ins["torchvision.datasets"].VisionDataset = type("VisionDataset", (), {"__init__": unavailable})  # type: ignore[attr-defined]
    stand_ins["torchvision.datasets"].CIFAR10 = unavailable  # type: ignore[attr-defined]
    stand_ins["torchvision.transforms.functional"].to_tensor = unavailable  # type: ignore[attr-defined]
    sys.modules.update(stand_ins)
    try:
        import streaming
    finally:
        for name in names:
            sys.modules.pop(name, None)
    return streaming


MOSAIC_NAMES = re.compile(
    r"^\d{6}_(locals|barrier|next_epoch|cache_usage|shard_states|shard_access_times|resume|epoch_\w+)$"
)
"""The shared-memory blocks MosaicML Streaming makes, by prefix (``/dev/shm/000000_locals``, ...)."""
MOSAIC_LOCKS = re.compile(r"^\d{6}_(barrier|cache)_filelock$")
"""Its lock files, in the temporary folder."""


@contextmanager
def one_mosaic_registration_at_a_time() -> Iterator[None]:
    """Make MosaicML Streaming datasets inside this: no other run on this machine makes one meanwhile.

    Mosaic takes the first shared-memory prefix no block holds, then registers it (its ranks agree on it
    across two barriers): two runs doing so at once (a pytest-xdist worker each) can take the same prefix.
    Every rank enters; rank 0 holds a machine-wide lock, the others wait at a barrier, so no rank blocks on
    the lock inside Mosaic's barriers.
    """
    import fcntl
    import tempfile

    import torch.distributed as dist

    spread = dist.is_available() and dist.is_initialized()
    holder = not spread or dist.get_rank() == 0
    with open(Path(tempfile.gettempdir()) / "lightning-resumable-tests-mosaic.lock", "a") as lock:
        if holder:
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if spread:
                dist.barrier()
            yield
            if spread:
                dist.barrier()
        finally:
            if holder:
                fcntl.flock(lock, fcntl.LOCK_UN)


def _files_open_on_this_machine() -> set[str]:
    """Every path a live process has open or mapped (``/proc``); a process that ends meanwhile is skipped."""
    held: set[str] = set()
    for process in Path("/proc").glob("[0-9]*"):
        try:
            for descriptor in (process / "fd").iterdir():
                held.add(os.readlink(descriptor))
            for line in (process / "maps").read_text().splitlines():
                if "/" in line:
                    held.add(line[line.index("/") :])
        except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
            continue
    return held


def clean_mosaic_memory() -> None:
    """Remove the shared-memory blocks and lock files MosaicML Streaming left on this machine that no live
    process holds, at the start of a test module that uses it.

    A run that ends without Mosaic's exit handlers (a stopped or killed run, as a crash) leaves them, and
    Mosaic's own ``clean_stale_shared_memory`` stops at the first free prefix: the blocks left past a gap
    made a later dataset fail with ``FileExistsError`` (seen here). A block a process holds is another
    run's, live (a test on the other pytest-xdist worker): removing it made that run's workers fail
    (CI, the data libraries' preemption matrix, seed 7). Nothing of a prefix whose blocks a process holds is
    removed: a lock file is open only while a process takes it, and one removed between two takes let two of a
    live run's workers hold Mosaic's barrier lock at once (on two files), and the barrier never opened (a soak's
    uninterrupted Mosaic run, its 4 workers' barrier with 3 arrived, hung). Under
    `one_mosaic_registration_at_a_time`, so no run is between taking a prefix and holding its blocks.
    """
    import tempfile

    with one_mosaic_registration_at_a_time():
        held = _files_open_on_this_machine()
        shm = Path("/dev/shm")
        blocks = [path for path in shm.glob("[0-9]*_*") if MOSAIC_NAMES.match(path.name)] if shm.is_dir() else []
        live = {path.name[:6] for path in blocks if str(path) in held}
        locks = [path for path in Path(tempfile.gettempdir()).glob("[0-9]*_*") if MOSAIC_LOCKS.match(path.name)]
        for path in blocks + locks:
            if path.name[:6] not in live and str(path) not in held:
                path.unlink(missing_ok=True)


MOSAIC_DIR = "mosaic-shards"
"""Where a runner's MosaicML Streaming scenarios read their shards: beside its run directories (`write_mosaic`)."""


def write_mosaic(directory: Path, size: int, first: int = 0, per_shard: int = 6) -> None:
    """Write ids ``first..first+size-1`` as MosaicML Streaming MDS shards of ``per_shard`` samples (8 shards
    of 6 for 48), with ``MDSWriter``."""
    with import_streaming().MDSWriter(out=str(directory), columns={"id": "int"}, size_limit=per_shard * 20) as writer:
        for sample_id in range(first, first + size):
            writer.write({"id": sample_id})
    written = json.loads((directory / "index.json").read_text())["shards"]
    if sum(shard["samples"] for shard in written) != size:
        raise RuntimeError(f"MDSWriter wrote {written!r:.300} to {directory}, not {size} samples")


def mosaic_stream(directory: Path, batch_size: int) -> Any:
    """A MosaicML Streaming ``StreamingDataset`` over the shards in ``directory``, shuffled, each sample
    augmented in ``__getitem__`` (Mosaic's documented way to transform), as a user's subclass does."""
    augmenting = augmenting_subclass("MosaicAugmented")
    with one_mosaic_registration_at_a_time():
        return augmenting(local=str(directory), shuffle=True, shuffle_seed=7, batch_size=batch_size)


def hf_collate(rows: list[dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([row["id"] for row in rows]), torch.tensor([row["x"] for row in rows])


class CurriculumDataset(IdDataset):
    """A dataset with state of its own: the level, raised at the end of each epoch, changes every sample."""

    def state_dict(self) -> dict[str, int]:
        return {"level": self.level}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.level = state["level"]


class Recorder:
    def __init__(self, path: Path) -> None:
        self.file = path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())


def parameters_digest(module: torch.nn.Module) -> str:
    """The bits of ``module``'s parameters (each rank's own shard under FSDP2)."""
    digest = hashlib.blake2b(digest_size=8)
    for parameter in module.parameters():
        local = parameter.to_local() if hasattr(parameter, "to_local") else parameter
        digest.update(local.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def hang_forever() -> None:
    threading.Event().wait()


def stop_now(trainer: L.Trainer, checkpoint: str) -> None:
    trainer.save_checkpoint(checkpoint)
    os._exit(0)


class StepRecorder(L.Callback):
    """Records each completed step, and each completed validation (its global step, epoch, batches and
    ``val_loss`` bits); runs before StopAt so the step that triggers a stop is recorded."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.recorder: Recorder | None = None
        self.validations: Recorder | None = None
        self.val_batches = 0
        self.steps = self.validated = 0  # recorded by this process

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        out_dir = Path(self.config["out_dir"])
        self.recorder = Recorder(out_dir / f"{self.config['phase']}.rank{trainer.global_rank}.jsonl")
        self.validations = Recorder(out_dir / f"{self.config['phase']}.val.rank{trainer.global_rank}.jsonl")

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        """What this rank had recorded at each save of the fit (the steps and validations a resume from it keeps)."""
        if trainer.state.fn != "fit":
            return
        saved = {"global_step": trainer.global_step, "steps": self.steps, "validations": self.validated}
        saved["interrupted"] = trainer.interrupted  # the exception path's save (OnExceptionCheckpoint)
        # Which save this is (every rank makes the same saves): the checkpoint names its record, where a global
        # step does not (inside an accumulation window several saves share one; the HPC save and a later one).
        saved["save"] = checkpoint["e2e_save"] = self.saves = getattr(self, "saves", -1) + 1
        with (Path(self.config["out_dir"]) / f"{self.config['phase']}.saves.rank{trainer.global_rank}.jsonl").open(
            "a"
        ) as saves:
            saves.write(json.dumps(saved) + "\n")

    def on_exception(self, trainer: L.Trainer, pl_module: Any, exception: BaseException) -> None:
        """How this rank's fit ended, and where: a preemption must end every rank through Lightning's exception
        at the same step."""
        done = trainer.fit_loop.epoch_loop.batch_progress.current.completed
        ended = {"exception": type(exception).__name__, "epoch": trainer.current_epoch, "batches": done}
        ended.update(step=trainer.global_step, message=str(exception)[:500])
        out = Path(self.config["out_dir"]) / f"{self.config['phase']}.ended.rank{trainer.global_rank}.json"
        out.write_text(json.dumps(ended))

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        assert self.recorder is not None
        parts = batch if isinstance(batch, dict) else {"": batch}  # a CombinedLoader's batch is a dict
        ids = {key: None if part is None else part[0].tolist() for key, part in parts.items()}
        aug = {key: None if part is None else part[1][:, 1:].tolist() for key, part in parts.items()}
        record = {
            "epoch": trainer.current_epoch,
            "batch": batch_idx,
            "ids": ids.get("", ids),
            "aug": aug.get("", aug),
            "loss": outputs["loss"].item(),
        }
        if self.config.get("curriculum"):
            record["level"] = batch[1][:, 0].floor_divide(10).int().tolist()
        if self.config.get("online_mixing"):  # the weights the step was drawn under, and a change it asked
            data = ResumableDataCallback.of(trainer)
            owner = data._owner  # the library's count of the epoch's batch (Lightning's may run on across resumes)
            record["weights"] = owner.weights_of(owner.training_batch)  # type: ignore[union-attr]
            record["asked"] = pl_module.__dict__.pop("asked_change", None)
            record["changes"] = len(data.weight_changes())
        if self.config["world_size"] <= 2:  # bit for bit there: the parameters after the step
            record["params"] = parameters_digest(pl_module)
        self.recorder.write(record)
        self.steps += 1

    def on_validation_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        self.val_batches = 0

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: Any, *args: Any, **kwargs: Any) -> None:
        self.val_batches += 1

    def on_validation_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        if self.validations is None or trainer.sanity_checking or trainer.state.fn != "fit":
            return
        loss = trainer.callback_metrics.get("val_loss")
        self.validated += 1
        self.validations.write(
            {
                "step": trainer.global_step,
                "epoch": trainer.current_epoch,
                "batches": self.val_batches,
                "val_loss": None if loss is None else loss.item(),
                **(
                    {"asked": pl_module.__dict__.pop("validation_change", None)}
                    if self.config.get("online_in_validation")
                    else {}
                ),
            }
        )

    def on_fit_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        """What the monitoring callbacks chose: the best checkpoint and score, EarlyStopping's count."""
        choices: dict[str, Any] = {}
        for callback in trainer.callbacks:  # type: ignore[attr-defined]
            if isinstance(callback, ModelCheckpoint) and callback.monitor is not None:
                score = callback.best_model_score
                choices["best"] = [Path(callback.best_model_path).name, None if score is None else score.item()]
            if isinstance(callback, EarlyStopping):
                best = callback.best_score
                choices["early_stopping"] = [callback.wait_count, best.item(), callback.stopped_epoch]
        if choices:
            out = Path(self.config["out_dir"]) / f"{self.config['phase']}.choices.rank{trainer.global_rank}.json"
            out.write_text(json.dumps(choices))


class Model(L.LightningModule):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.config = config
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
        self.automatic_optimization = not config.get("manual_optimization")

    def configure_model(self) -> None:
        # Lightning calls it in every stage (validate() then fit() on the same model): idempotent, as it asks.
        if not self.config.get("strategy", "ddp").startswith("model_parallel") or getattr(self, "sharded", False):
            return
        self.sharded = True
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"]  # FSDP2 over the data-parallel ranks, on gloo
        for layer in (self.net[0], self.net[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(self.net, mesh=mesh)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        stop = self.config["stop"]
        stops = self.config["phase"] == "stop" or self.config.get("leg", {}).get("kind") in STOP_KINDS
        if stops and stop["kind"] == "in_step" and [self.current_epoch, batch_idx] == [stop["epoch"], stop["batch"]]:
            stop_now(self.trainer, self.config["checkpoint"])
        time.sleep(self.config.get("step_seconds", 0))  # a slower step, where a test aims a kill
        if self.config["phase"] == "preempt" and self.config.get("sigterm_at") == [self.current_epoch, batch_idx]:
            os.kill(os.getpid(), signal.SIGTERM)  # a preemption notice arriving during this step, on every rank
        if self.config.get("leg_signal_at") == [self.current_epoch, batch_idx]:  # a chain's leg ends by a signal
            if self.config["leg"]["kind"] == "sigterm":
                os.kill(os.getpid(), signal.SIGTERM)
            else:
                raise KeyboardInterrupt  # as Ctrl-C in this step, on every rank
        if self.config.get("hang_rank") == self.global_rank:  # a hung rank, for the harness's timeout test
            hang_forever()
        if self.config.get("online_mixing"):
            return self.online_mixing_step(batch, batch_idx)
        parts = list(batch.values()) if isinstance(batch, dict) else [batch]
        loss: torch.Tensor = sum(self.net(part[1]).pow(2).mean() for part in parts if part is not None)  # type: ignore[assignment]
        if not self.automatic_optimization:  # the user's own optimizer calls
            optimizer = self.optimizers()
            optimizer.zero_grad()  # type: ignore[union-attr]
            self.manual_backward(loss)
            optimizer.step()  # type: ignore[union-attr]
        return loss

    def online_mixing_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """A DoReMi-style reweighting from the training's own losses: every ``online_mixing`` batches of an
        epoch, the mixture's weights take an exponentiated-gradient step from each source's mean loss over
        the global batch (all-reduced, so every rank sets the same weights)."""
        per_sample = self.net(batch[1]).pow(2).mean(dim=1)
        every = self.config["online_mixing"]
        if batch_idx % every == every - 1:
            data = ResumableDataCallback.of(self.trainer)
            sums, counts = data.batch_sources().totals(per_sample.detach().double())
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                torch.distributed.all_reduce(sums)
                torch.distributed.all_reduce(counts)
            first = dict(self.config["mixture_weights"][0][1])
            weights = reweighted(data, first, sums, counts)
            if self.config.get("online_disagree") and self.global_rank == 1:  # local losses, not all-reduced ones
                weights = {name: weight * (1 + place) for place, (name, weight) in enumerate(sorted(weights.items()))}
            self.asked_change = data.set_mixture_weights(weights).to_dict()
        return per_sample.mean()

    def on_validation_epoch_end(self) -> None:
        """With ``online_in_validation``, a change of weights asked during each validation of the fit."""
        if (
            self.config.get("online_in_validation")
            and not self.trainer.sanity_checking
            and self.trainer.state.fn == "fit"
        ):
            data = ResumableDataCallback.of(self.trainer)
            turn = len(data.weight_changes()) % 3
            weights = {
                name: 1.0 + (place == turn) * 3 for place, (name, _) in enumerate(self.config["mixture_sources"])
            }
            self.validation_change = data.set_mixture_weights(weights).to_dict()

    def on_train_epoch_end(self) -> None:
        if self.config.get("curriculum"):
            self.trainer.datamodule.train_set.level += 1  # type: ignore[attr-defined]  # on every rank alike

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", self.net(batch[1]).pow(2).mean(), sync_dist=True)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.log("test_loss", self.net(batch[1]).pow(2).mean(), sync_dist=True)

    def predict_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.net(batch[1])

    def configure_optimizers(self) -> Any:
        # Under ModelParallelStrategy an optimizer with state: Lightning 2.6 cannot load a full checkpoint of
        # one without (``_rekey_optimizer_state_if_needed`` indexes the first state entry).
        momentum = 0.9 if self.config.get("strategy", "ddp").startswith("model_parallel") else 0.0
        optimizer = torch.optim.SGD(self.parameters(), lr=0.01, momentum=momentum)
        if not self.config.get("estimated_stepping_batches"):
            return optimizer
        # Runs setup_data before the checkpoint is restored (Lightning #20550). The schedule keeps the
        # learning rate constant, so the scenario shares the uninterrupted run of the one without it.
        total = int(self.trainer.estimated_stepping_batches)
        scheduler = torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=total)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def reweighted(
    data: ResumableDataCallback, first: dict[str, float], sums: torch.Tensor, counts: torch.Tensor
) -> dict[str, float]:
    """An exponentiated-gradient step (step size 1) of the newest weights from each source's mean loss,
    smoothed with 10% of the uniform weights (a source absent from the batch keeps its weight)."""
    sources = data.batch_sources().names
    changes = data.weight_changes()
    current: dict[str, Any] = dict(changes[-1].weights()) if changes else first
    weights = torch.tensor([float(current.get(name, 0)) for name in sources], dtype=torch.float64)
    means = torch.where(counts > 0, sums / counts.clamp(min=1), torch.zeros_like(sums))
    weights = weights * torch.exp(means)
    weights = 0.9 * weights / weights.sum() + 0.1 / len(sources)
    return dict(zip(sources, weights.tolist(), strict=True))


def weights_of(size: int) -> list[float]:
    """Every fifth sample never drawn, the others weighted 1 to 3."""
    return [0.0 if index % 5 == 0 else 1.0 + index % 3 for index in range(size)]


def subset_of(size: int) -> list[int]:
    return [index for index in range(size) if index % 3 != 1]


def make_sampler(config: dict[str, Any], dataset: Dataset[Any]) -> Sampler[int] | None:
    """The scenario's standard sampler, or None for ``shuffle``."""
    size = config["dataset_size"]
    kind = config.get("sampler", "shuffle")
    if kind == "weighted":
        return WeightedRandomSampler(weights_of(size), num_samples=size)
    if kind == "replacement":
        return RandomSampler(dataset, replacement=True)  # type: ignore[arg-type]
    if kind == "num_samples":
        return RandomSampler(dataset, num_samples=size + 13)  # type: ignore[arg-type]
    if kind == "subset":
        return SubsetRandomSampler(subset_of(size))
    return None


class Bucketing(ResumableBatchSampler):
    """Batches of similar 'lengths' (``1 + index * 7 % 13``) under a budget of 24 padded tokens: sizes vary."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.lengths = [1 + index * 7 % 13 for index in range(size)]

    def epoch_batches(self, epoch: int, generator: torch.Generator) -> list[list[int]]:
        order = sorted(torch.randperm(len(self.lengths), generator=generator).tolist(), key=self.lengths.__getitem__)
        batches, batch = [], []
        for index in order:
            if batch and (len(batch) + 1) * self.lengths[index] > 24:
                batches.append(batch)
                batch = []
            batch.append(index)
        batches.append(batch)
        return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


class TaggedLoader(DataLoader[Any]):
    """A DataLoader subclass with a required argument that it keeps under another name."""

    def __init__(self, dataset: Dataset[Any], tag: str, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.label = tag


def make_loader(config: dict[str, Any], dataset: Dataset[Any], shuffle: bool, drop_last: bool) -> DataLoader[Any]:
    if config["loader"] == "TaggedLoader":
        return TaggedLoader(dataset, "e2e", **loader_arguments(config, dataset, shuffle, drop_last))
    loader_type = StatefulDataLoader if config["loader"] == "StatefulDataLoader" else DataLoader
    return loader_type(dataset, **loader_arguments(config, dataset, shuffle, drop_last))


def loader_arguments(config: dict[str, Any], dataset: Dataset[Any], shuffle: bool, drop_last: bool) -> dict[str, Any]:
    workers = config["num_workers"]
    if config.get("sampler") == "bucketing":
        return {"batch_sampler": Bucketing(config["dataset_size"]), "num_workers": workers}
    sampler = make_sampler(config, dataset)
    return dict(
        batch_size=config["batch_size"],
        shuffle=shuffle if sampler is None else None,
        sampler=sampler,
        drop_last=drop_last,
        num_workers=workers,
        persistent_workers=workers > 0 and config.get("persistent_workers", False),
    )


def workers_of(config: dict[str, Any]) -> int:
    """The run's loader workers: the resume's, where the scenario gives other ones there."""
    resumed = config["phase"].startswith("resume") and config.get("resume_num_workers") is not None
    return int(config["resume_num_workers"] if resumed else config["num_workers"])


def kept_workers(config: dict[str, Any], workers: int) -> dict[str, Any]:
    """``persistent_workers=True`` where the scenario keeps its workers from pass to pass (and has workers); else
    nothing, so a loader that would refuse it is built as before."""
    return {"persistent_workers": True} if workers > 0 and config.get("persistent_workers", False) else {}


class PlainData(L.LightningDataModule):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.config = config

    def train_dataloader(self) -> Any:
        return TRAIN_LOADERS[self.config.get("data", "map")](self)

    def mosaic_loader(self) -> Any:
        from lightning_resumable import set_mosaic_environment

        set_mosaic_environment(self.trainer)  # Lightning's launcher sets neither RANK nor LOCAL_WORLD_SIZE
        # The global batch stays the same on another world size, unless the resume is given its batch size.
        batch_size = self.config["batch_size"] * self.config["first_world_size"] // self.config["world_size"]
        if str(self.config.get("phase", "")).startswith("resume") and self.config.get("resume_batch_size") is not None:
            batch_size = self.config["batch_size"]
        batch_size = self.config.get("given_batch_size") or batch_size  # a chain's leg on a layout of its own
        self.train_set = mosaic_stream(Path(self.config["out_dir"]).parent / MOSAIC_DIR, batch_size)
        loader_type = import_streaming().StreamingDataLoader if self.config["loader"] != "DataLoader" else DataLoader
        workers = workers_of(self.config)
        return loader_type(
            self.train_set, batch_size=batch_size, num_workers=workers, **kept_workers(self.config, workers)
        )

    def litdata_loader(self, combined: bool) -> Any:
        from litdata import CombinedStreamingDataset, StreamingDataLoader

        root = Path(self.config["out_dir"]).parent
        self.train_set = litdata_stream(root / LITDATA_DIR)
        if combined:
            second = litdata_stream(root / LITDATA_SECOND_DIR)
            self.train_set = CombinedStreamingDataset([self.train_set, second], seed=5)
        else:
            self.declare_order(self.train_set, batched=True)
        loader_type = StreamingDataLoader if self.config["loader"] == "StreamingDataLoader" else DataLoader
        # The global batch stays the same on another world size, unless the resume gives another batch size.
        batch_size = self.config["batch_size"] * self.config["first_world_size"] // self.config["world_size"]
        workers = workers_of(self.config)
        if self.config["phase"].startswith("resume"):
            batch_size = self.config.get("resume_batch_size") or batch_size
        batch_size = self.config.get("given_batch_size") or batch_size  # a chain's leg on a layout of its own
        return loader_type(
            self.train_set, batch_size=batch_size, num_workers=workers, **kept_workers(self.config, workers)
        )

    def several_loaders(self, combined: bool) -> Any:
        size_a, size_b = COMBINED_SIZES
        loaders = {
            "a": make_loader(self.config, IdDataset(size_a), shuffle=True, drop_last=False),
            "b": make_loader(self.config, OffsetDataset(size_b, offset=1000), shuffle=True, drop_last=False),
        }
        return CombinedLoader(loaders, self.config["mode"]) if combined else loaders

    def mixture_loader(self) -> DataLoader[Any]:
        """A ``Mixture`` of the scenario's sources (ids from `MIXTURE_OFFSETS`), with its schedule; a resumed
        run reads the resume's sources and schedule where the scenario gives them."""
        sources, weights = self.config["mixture_sources"], self.config["mixture_weights"]
        if self.config["phase"].startswith("resume"):
            sources = self.config.get("resume_mixture_sources") or sources
            weights = self.config.get("resume_mixture_weights") or weights
        datasets = {name: OffsetDataset(size, offset=MIXTURE_OFFSETS[name]) for name, size in sources}
        schedule = WeightSchedule({step: dict(changed) for step, changed in weights})
        self.train_set = Mixture(datasets, schedule, samples_per_epoch=self.config["dataset_size"])
        workers, batch_size = self.config["num_workers"], self.config["batch_size"]
        return DataLoader(
            self.train_set, batch_size=batch_size, num_workers=workers, **kept_workers(self.config, workers)
        )

    def mixture_sources_and_weights(self) -> tuple[tuple[tuple[str, int], ...], WeightSchedule]:
        sources, weights = self.config["mixture_sources"], self.config["mixture_weights"]
        if self.config["phase"].startswith("resume"):
            sources = self.config.get("resume_mixture_sources") or sources
            weights = self.config.get("resume_mixture_weights") or weights
        return sources, WeightSchedule({step: dict(changed) for step, changed in weights})

    def sharded_mixture_loader(self, combined: bool) -> Any:
        """A ``Mixture`` of LitData (chunks, token blocks) and Mosaic sources read chunk by chunk; ``combined``:
        LitData's ``CombinedStreamingDataset`` of the LitData ones with the weights at step 0, in its
        ``StreamingDataLoader``, as users write it (read as the equivalent ``Mixture``, ordered by the run's seed,
        not the combined dataset's 5: a ``Mixture`` of the same sources is the run it equals)."""
        from lightning_resumable import set_mosaic_environment

        root = Path(self.config["out_dir"]).parent
        sources, schedule = self.mixture_sources_and_weights()
        names = [name for name, _ in sources]
        batch_size, workers = self.config["batch_size"], self.config["num_workers"]
        if combined:
            from litdata import CombinedStreamingDataset, StreamingDataLoader

            weights = schedule.weights_at(0)
            datasets = [sharded_source(root, name) for name in names]
            self.train_set = CombinedStreamingDataset(
                datasets, seed=5, weights=[weights[name] for name in names], iterate_over_all=False
            )
            return StreamingDataLoader(
                self.train_set, batch_size=batch_size, num_workers=workers, **kept_workers(self.config, workers)
            )
        if "c" in names:
            set_mosaic_environment(self.trainer)
        datasets = {name: sharded_source(root, name) for name in names}
        self.train_set = Mixture(datasets, schedule, samples_per_epoch=self.config["dataset_size"])
        return DataLoader(
            self.train_set, batch_size=batch_size, num_workers=workers, **kept_workers(self.config, workers)
        )

    def map_loader(self) -> Any:
        resuming = self.config["phase"].startswith("resume")
        relisted = self.config.get("relist_on_resume", False) and resuming
        dataset_type = CurriculumDataset if self.config.get("curriculum") else IdDataset
        if self.config.get("augment"):
            self.train_set = AugmentedImages(self.config["dataset_size"], self.config["augment"])
        else:
            self.train_set = dataset_type(self.config["dataset_size"], relisted=relisted)
        drop_last = self.config["drop_last"]
        if resuming and self.config.get("resume_drop_last") is not None:
            drop_last = self.config["resume_drop_last"]
        return make_loader(self.config, self.train_set, self.config["shuffle"], drop_last)

    def stream_loader(self, data: str) -> DataLoader[Any]:
        rank, world_size = self.trainer.global_rank, self.trainer.world_size  # type: ignore[union-attr]
        workers = workers_of(self.config)
        batch_size = self.config["batch_size"]
        if data in ("hf", "hf-arrow", "hf-interleaved", "wds") and not self.config.get("wds_form"):  # resume anywhere
            # batched by the loader: the global batch stays on another world size, unless the resume gives another
            batch_size = batch_size * self.config["first_world_size"] // self.config["world_size"]
            if self.config["phase"].startswith("resume"):
                batch_size = self.config.get("resume_batch_size") or batch_size
            batch_size = self.config.get("given_batch_size") or batch_size  # a chain's leg on a layout of its own
        if data == "hf":
            stream, collate = (
                hf_stream(STREAM_SIZE, rank, world_size, self.config.get("shuffle_buffer", 0)),
                hf_collate,
            )
        elif data == "hf-interleaved":
            stream, collate = (
                hf_interleaved_stream(STREAM_SIZE, rank, world_size, self.config.get("shuffle_buffer", 0)),
                hf_collate,
            )
        elif data == "hf-arrow":
            stream, collate = (
                hf_arrow_stream(STREAM_SIZE, rank, world_size, self.config.get("shuffle_buffer") or 8),
                hf_arrow_collate,
            )
        elif data == "wds":
            root, form = Path(self.config["out_dir"]).parent, self.config.get("wds_form", "")
            buffer, size = self.config.get("shuffle_buffer") or 1, self.config["batch_size"]
            stream, collate = wds_stream(root, STREAM_SIZE, buffer, form, size), None
            refused = self.config.get("wds_refused", "")
            if refused:
                made = wds_refused(root, STREAM_SIZE, buffer, refused, size)
                if refused == "web_loader_stages":
                    return made  # type: ignore[no-any-return]
                stream = made
            elif form:  # batched in the pipeline
                import webdataset as wds

                self.declare_order(stream, batched=False)
                self.train_set = stream
                loader_type = wds.WebLoader if form == "web-loader" else DataLoader
                return loader_type(stream, batch_size=None, num_workers=workers)  # type: ignore[no-any-return]
        else:
            stream, collate = ShardedStream(STREAM_SIZE, rank, world_size), None
        self.declare_order(stream, batched=True)
        if not isinstance(self, ResumableDataModule) and hasattr(stream, "set_epoch"):  # the library sets it itself
            stream.set_epoch(self.trainer.current_epoch)  # type: ignore[union-attr]  # restored before this runs
        self.train_set = stream
        loader_type = StatefulDataLoader if self.config["loader"] == "StatefulDataLoader" else DataLoader
        persistent = workers > 0 and self.config.get("persistent_workers", False)
        return loader_type(  # type: ignore[no-any-return]
            stream, batch_size=batch_size, num_workers=workers, collate_fn=collate, persistent_workers=persistent,
        )  # fmt: skip

    def declare_order(self, stream: Any, batched: bool) -> None:
        """``stream_order``: the stream declares that layout (the first launch's) as the order of every epoch, on any
        layout; ``batched``: by the loader (else its pipeline batches, and the batch size declared is ``None``)."""
        order = self.config.get("stream_order")
        if order is not None:
            stream.resumable_stream_order = (order[0], order[1], order[2] if batched else None)

    def val_dataloader(self) -> DataLoader[Any]:
        """``val_loader``: ``plain``, ``shuffled`` (Lightning keeps the shuffle under DDP) or ``batch_sampler``."""
        dataset = IdDataset(self.config.get("val_size", 8))
        kind, workers = self.config.get("val_loader", "plain"), self.config.get("val_workers", 0)
        if kind == "batch_sampler":
            batches = BatchSampler(SequentialSampler(dataset), 4, drop_last=False)
            return DataLoader(dataset, batch_sampler=batches, num_workers=workers)
        return DataLoader(dataset, batch_size=4, shuffle=kind == "shuffled", num_workers=workers)

    test_dataloader = val_dataloader
    predict_dataloader = val_dataloader


TRAIN_LOADERS: dict[str, Callable[[PlainData], Any]] = {
    "map": PlainData.map_loader,
    "stream": lambda data: data.stream_loader("stream"),
    "hf": lambda data: data.stream_loader("hf"),
    "hf-arrow": lambda data: data.stream_loader("hf-arrow"),
    "hf-interleaved": lambda data: data.stream_loader("hf-interleaved"),
    "wds": lambda data: data.stream_loader("wds"),
    "mosaic": PlainData.mosaic_loader,
    "litdata": lambda data: data.litdata_loader(combined=False),
    "litdata-combined": lambda data: data.litdata_loader(combined=True),
    "combined": lambda data: data.several_loaders(combined=True),
    "dict": lambda data: data.several_loaders(combined=False),
    "mixture": PlainData.mixture_loader,
    "sharded-mixture": lambda data: data.sharded_mixture_loader(combined=False),
    "litdata-weighted": lambda data: data.sharded_mixture_loader(combined=True),
}
"""How each train data of ``data_setups.SETUPS`` is built, by its name (``Scenario.data``)."""
assert set(TRAIN_LOADERS) == set(SETUPS), "every data setup is built, and no other"


class ResumableData(ResumableDataModule, PlainData):
    def train_dataloader(self) -> Any:
        return super().train_dataloader()


class SetStreamEpoch(L.Callback):
    """Without the library, a user sets the stream's epoch at each epoch start (Lightning sets only samplers')."""

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        stream = getattr(trainer.datamodule, "train_set", None)  # type: ignore[attr-defined]
        if hasattr(stream, "set_epoch"):
            stream.set_epoch(trainer.current_epoch)


STOP_KINDS = ("batch_end", "last_batch", "in_step", "validation", "in_validation", "kill")
"""The stops `StopAt` makes (a chain's leg of another kind ends by a signal, an interrupt or its own end)."""


class StopAt(L.Callback):
    """Saves a checkpoint at the configured point of the ``stop`` phase and ends the process.

    With ``monitor``, ModelCheckpoint writes the checkpoint at the stop batch's validation (its ``last``,
    which the resume reads), and the process ends at the next training batch or epoch end, as a kill
    after the checkpoint would."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.kind = config["stop"]["kind"]
        self.target = (config["stop"]["epoch"], config["stop"]["batch"])
        self.val_batch = config["stop"].get("val_batch", 1)
        self.checkpoint = config["checkpoint"]
        self.monitor = bool(config.get("monitor"))
        self.last_batch: tuple[int, int] | None = None
        self.validated = False

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.validated:
            os._exit(0)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        if self.validated:
            os._exit(0)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.last_batch = (trainer.current_epoch, batch_idx)
        if self.kind in ("batch_end", "last_batch") and self.last_batch == self.target:
            stop_now(trainer, self.checkpoint)
        if self.kind == "kill" and self.last_batch == self.target:
            os._exit(0)  # as a SIGKILL after this step: the last periodic save (`ExtraSaves`) is what resumes

    def on_validation_batch_end(
        self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.kind == "in_validation" and self.last_batch == self.target and batch_idx == self.val_batch:
            stop_now(trainer, self.checkpoint)

    def on_validation_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        if self.kind == "validation" and self.last_batch == self.target:
            if not self.monitor:
                stop_now(trainer, self.checkpoint)
            self.validated = True  # ModelCheckpoint saves after this callback: end at the next batch


def launched_rank() -> int:
    """This process's global rank, from the variables its launcher set (before Lightning reads them)."""
    for name in ("RANK", "SLURM_PROCID", "LOCAL_RANK"):
        if name in os.environ:
            return int(os.environ[name])
    return 0


class Preempt(L.Callback):
    """Signals the run as a cluster does (``config["preempt"]``): ``signal`` (``TERM``, or ``USR1``, SLURM's
    requeue signal) to ``target`` (``every rank``, ``rank 0``, ``rank 1``, ``group``: the process group, loader
    workers included; ``launcher``: torchrun's agent, which signals each rank's process group), once, at the
    first point of kind ``when`` (``preemption.PREEMPTION_WHENS``) at or after batch ``at`` = [epoch, batch]. The signal
    comes from a ``kill`` process, as from a scheduler: torch's worker handler tells its parent's SIGTERM from
    anyone else's. The time it was sent goes to ``{phase}.signalled.json``."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config, self.preempt = config, config["preempt"]
        self.out = Path(config["out_dir"])
        self.when, self.at = self.preempt["when"], tuple(self.preempt["at"])
        self.sent = False
        self.targets: list[str] = []
        self.past_at = False  # a training batch at or after ``at`` has ended
        self.armed = False  # workers_start: the next loader worker rank 0 starts sends the signal
        if self.when == "workers_start":
            start = multiprocessing.process.BaseProcess.start

            def start_then_signal(process: Any) -> None:  # whatever the start method: fork, forkserver, spawn
                start(process)
                self.from_a_started_worker()

            multiprocessing.process.BaseProcess.start = start_then_signal  # type: ignore[method-assign]

    def reached(self, trainer: L.Trainer, batch_idx: int) -> bool:
        return (trainer.current_epoch, batch_idx) >= self.at

    def send(self) -> None:
        if self.sent or launched_rank() != 0:  # (a worker of rank 0 inherits its rank's variables)
            return
        self.sent = True
        phase = self.config["phase"]
        pids: list[str] = []
        for rank in range(self.config["world_size"]):
            path = self.out / f"{phase}.rank{rank}.pid"
            for _ in range(6000):  # each rank writes it as it starts: before the setup hooks' barrier
                if path.exists() and path.read_text():
                    break
                time.sleep(0.01)  # polling a file another process writes
            pids.append(path.read_text())
        target = self.preempt["target"]
        targets = {
            "every rank": pids,
            "rank 0": pids[:1],
            "rank 1": pids[1:2],
            "group": [f"-{os.getpgrp()}"],
            "launcher": [Path(f"/proc/{pids[0]}/stat").read_text().rsplit(")", 1)[1].split()[1]],  # rank 0's parent
        }[target]
        self.targets = targets
        sent = {"at": time.monotonic(), "when": self.when, "pid": os.getpid(), "targets": targets}
        written = self.out / f"{phase}.signalled.json.{os.getpid()}"
        written.write_text(json.dumps(sent))
        written.rename(self.out / f"{phase}.signalled.json")  # whole when a test reads it
        # ``at_once``: two signals back to back (a scheduler's and a forwarded one), from one process: a second one
        # started from here could still be in this process group when a launcher signals it after the first.
        self.kill(self.preempt["signal"], twice=self.preempt.get("again") == "at_once")

    def kill(self, signal_name: str, after_s: float = 0.0, twice: bool = False) -> None:
        """From a process outside the job's process group, as from a scheduler (and not killed by its own
        signal); ``after_s``: that process waits so long first, while this one goes on."""
        command = ["kill", "-s", signal_name, "--", *self.targets, *(self.targets if twice else [])]
        if after_s:
            subprocess.Popen(["sh", "-c", f'sleep {after_s:.3f}; exec "$@"', "sh", *command], start_new_session=True)
        else:
            subprocess.run(command, check=True, start_new_session=True)

    def on_exception(self, trainer: L.Trainer, pl_module: Any, exception: BaseException) -> None:
        """A second signal while the fit ends (before ``OnExceptionCheckpoint``'s save, which runs after every other
        callback): ``while_ending``, the same signal again (a second ``scancel``, SLURM's SIGTERM at the time limit
        after ``--signal=TERM@...``); ``kill_while_saving``, SIGKILL a moment later (SLURM's, after KillWait)."""
        again = self.preempt.get("again")
        if not self.sent or launched_rank() != 0 or again not in ("while_ending", "kill_while_saving"):
            return
        if again == "while_ending":
            self.kill(self.preempt["signal"])
        else:
            self.kill("KILL", after_s=random.Random(str(self.config["seed"])).uniform(0.0, 0.3))

    def from_a_started_worker(self) -> None:
        """In rank 0, once it has started a process while armed (a loader worker, now starting): the first one
        sends the signal, which reaches that worker as it starts (a worker started by spawn or forkserver is still
        importing, one forked is on its way to its worker loop)."""
        if not self.armed:
            return
        self.armed = False
        self.send()

    def setup(self, trainer: L.Trainer, pl_module: Any, stage: str) -> None:
        """(After the library's callback's: each rank holds the signals from there.) The signal goes once every
        rank has set up: one that reaches a rank before its callback's setup ends it as without the library."""
        if stage != "fit":
            return
        phase = self.config["phase"]
        (self.out / f"{phase}.set_up.rank{launched_rank()}").touch()
        if self.when == "setup" and launched_rank() == 0:
            for rank in range(self.config["world_size"]):
                for _ in range(6000):
                    if (self.out / f"{phase}.set_up.rank{rank}").exists():
                        break
                    time.sleep(0.01)  # polling a file another rank writes
            self.send()

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        if self.when == "train_start":
            self.send()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        if self.when == "workers_start" and trainer.current_epoch == self.at[0]:
            if self.config["num_workers"] == 0:
                self.send()
            else:
                self.armed = launched_rank() == 0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.armed = False
        if self.when == "step" and self.reached(trainer, batch_idx):
            self.send()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.when == "batch" and self.reached(trainer, batch_idx):
            self.send()
        self.past_at = self.reached(trainer, batch_idx)

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: Any, *args: Any, **kwargs: Any) -> None:
        if self.when == "sanity" and trainer.sanity_checking:
            self.send()
        if self.when == "validation" and not trainer.sanity_checking and self.past_at:
            self.send()

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        if self.when == "save" and self.past_at:
            self.send()


class ExtraSaves(L.Callback):
    """Saves a checkpoint every ``every`` optimizer steps, as a cautious user does; it must change nothing."""

    def __init__(self, every: int, path: Path, at_window_ends: bool = False) -> None:
        self.every, self.path = every, path
        self.at_window_ends = at_window_ends  # once per optimizer step, at its window's end (a kill resumes there)
        self.saved_at = 0

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.at_window_ends and trainer.global_step == self.saved_at:
            return
        if trainer.global_step % self.every == 0:
            self.saved_at = trainer.global_step
            trainer.save_checkpoint(self.path)
            # What this rank had recorded at the save (`StepRecorder` runs first): a leg killed later resumes here.
            recorder = next(each for each in trainer.callbacks if isinstance(each, StepRecorder))  # type: ignore[attr-defined]
            counts = {"steps": recorder.steps, "validations": recorder.validated}
            (self.path.parent / f"{self.path.stem}.rank{trainer.global_rank}.json").write_text(json.dumps(counts))


def evaluate_after_fit(
    config: dict[str, Any], trainer: L.Trainer, model: Model, datamodule: Any, trainer_options: dict[str, Any]
) -> None:
    """As nearly every tutorial ends: validate, test and predict from "best" and from a path, on the trainer
    that fitted and on a new one. Each rank writes what each one returned."""
    results: dict[str, Any] = {}
    path = config["checkpoint"]
    results["validate best"] = trainer.validate(model, datamodule=datamodule, ckpt_path="best", verbose=False)
    results["test best"] = trainer.test(model, datamodule=datamodule, ckpt_path="best", verbose=False)
    results["predict path"] = len(trainer.predict(model, datamodule=datamodule, ckpt_path=path) or [])
    options = {**trainer_options, "callbacks": [ResumableDataCallback()], "enable_checkpointing": False}
    fresh = L.Trainer(**options)
    results["new validate path"] = fresh.validate(model, datamodule=datamodule, ckpt_path=path, verbose=False)
    results["new test path"] = fresh.test(model, datamodule=datamodule, ckpt_path=path, verbose=False)
    results["new predict path"] = len(fresh.predict(model, datamodule=datamodule, ckpt_path=path) or [])
    out = Path(config["out_dir"]) / f"evaluated.rank{trainer.global_rank}.json"
    out.write_text(json.dumps(results))


def use_start_method(method: str) -> None:
    """Start the run's loader workers by ``method``: ``fork`` (Python 3.11-3.13's default); ``forkserver`` or
    ``spawn`` given to each loader as its ``multiprocessing_context``, as a user passes it; ``default:METHOD`` set
    as the process default, as Python 3.14 sets ``forkserver`` (and torch's loaders follow it)."""
    if method.endswith("forkserver"):
        # Before Python 3.14 the forkserver never preloads ``__main__`` (CPython gh-126631): each worker it forks
        # runs the main module again, torch and Lightning with it (seconds). A user's script names its heavy modules
        # in the preload list, as this does (this module, or what it imports when it is the main one).
        # (Python 3.11's server does not take the rank's sys.path either, gh-117378: it finds this one by PYTHONPATH.)
        heavy = [__name__] if __name__ != "__main__" else ["torch", "lightning", "lightning_resumable"]
        multiprocessing.set_forkserver_preload(["__main__", *heavy])
        paths = [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
        os.environ["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
    if method.startswith("default:"):
        multiprocessing.set_start_method(method.removeprefix("default:"), force=True)
    elif method != "fork":
        construct = torch.utils.data.DataLoader.__init__

        @functools.wraps(construct)  # its signature: Lightning reads a loader's arguments through it
        def with_context(self: Any, *args: Any, **kwargs: Any) -> None:
            construct(self, *args, **kwargs)
            if self.num_workers > 0 and self.multiprocessing_context is None:
                self.multiprocessing_context = method

        torch.utils.data.DataLoader.__init__ = with_context  # type: ignore[method-assign]


def main(config_path: str) -> None:
    config = json.loads(Path(config_path).read_text())
    use_start_method(config.get("start_method", "fork"))
    # A test aims a signal at one rank: each rank says which process it is, as it starts.
    (Path(config["out_dir"]) / f"{config['phase']}.rank{launched_rank()}.pid").write_text(str(os.getpid()))
    if config.get("seed") is not None:
        L.seed_everything(config["seed"], verbose=False)
    torch.set_num_threads(1)
    callbacks: list[L.Callback] = [StepRecorder(config)]
    if config["resumable"]:
        options = dict(config.get("callback_options", []))
        if config.get("audit_dir"):
            options["audit_dir"] = config["audit_dir"]
        callbacks.append(ResumableDataCallback(**options))
        datamodule: L.LightningDataModule = ResumableData(config)
    else:
        datamodule = PlainData(config)
        callbacks.append(SetStreamEpoch())
    if config.get("extra_saves_every") and config["phase"] != "full":
        at_window_ends = bool(config.get("online_mixing"))
        callbacks.append(
            ExtraSaves(config["extra_saves_every"], Path(config["out_dir"]) / "extra.ckpt", at_window_ends)
        )
    if config["phase"] == "stop" or config.get("leg", {}).get("kind") in STOP_KINDS:
        callbacks.append(StopAt(config))
    if config.get("preempt"):
        callbacks.append(Preempt(config))
    if config.get("on_exception_checkpoint"):  # a preemption's SIGTERM becomes an exception; save there
        callbacks.append(OnExceptionCheckpoint(dirpath=config["out_dir"], filename="on_exception"))
    checkpoint_every = config.get("checkpoint_every")
    if checkpoint_every:  # as a long job checkpoints: every k steps, and last.ckpt
        callbacks.append(
            ModelCheckpoint(
                dirpath=config["checkpoint_dir"],
                filename="{step}",
                every_n_train_steps=checkpoint_every,
                save_last=True,
                save_top_k=-1,
            )
        )
    if config.get("monitor"):  # as a user keeps the best model and stops early on val_loss
        best = ModelCheckpoint(dirpath=config["out_dir"], filename="best-{step}", monitor="val_loss", save_top_k=1)
        # The newest checkpoint, written at every validation's end: in the stopped run, the one the resume reads.
        newest = Path(config["checkpoint"]).stem if config["phase"] == "stop" else "newest"
        newest_checkpoint = ModelCheckpoint(dirpath=config["out_dir"], filename=newest, enable_version_counter=False)
        callbacks += [best, newest_checkpoint, EarlyStopping(monitor="val_loss", patience=1000, check_finite=False)]
    if config.get("evaluate_after_fit"):  # "best" is the best of this fit's checkpoints
        callbacks.append(ModelCheckpoint(dirpath=Path(config["out_dir"]) / "best", filename="best-{step}"))
    world_size, num_nodes = config["world_size"], config.get("num_nodes", 1)
    strategy: Any = "ddp" if world_size > 1 else "auto"
    if config.get("strategy", "ddp").startswith("model_parallel"):
        from lightning.pytorch.strategies import ModelParallelStrategy

        sharded = config["strategy"] == "model_parallel_sharded"  # a distributed checkpoint: a directory
        strategy = ModelParallelStrategy(
            data_parallel_size=world_size, tensor_parallel_size=1, save_distributed_checkpoint=sharded
        )
    trainer_options: dict[str, Any] = dict(
        accelerator="cpu",
        devices=world_size // num_nodes,
        num_nodes=num_nodes,
        strategy=strategy,
        max_epochs=config["epochs"],
        max_steps=config.get("max_steps", -1),
        deterministic=True,
        callbacks=callbacks,
        val_check_interval=config.get("val_check_interval", 1.0),
        check_val_every_n_epoch=config.get("check_val_every_n_epoch", 1),
        accumulate_grad_batches=config.get("accumulate", 1),
        limit_train_batches=config.get("limit_train_batches") or 1.0,
        limit_val_batches=config.get("limit_val_batches", 1),
        num_sanity_val_steps=config.get("sanity_steps", 0),
        logger=False,
        enable_checkpointing=bool(
            checkpoint_every
            or config.get("on_exception_checkpoint")
            or config.get("evaluate_after_fit")
            or config.get("monitor")
        ),
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=config["out_dir"],
    )
    trainer = L.Trainer(**trainer_options)
    ckpt_path = config["checkpoint"] if config["phase"].startswith("resume") else config.get("resume_from")
    # Plain loaders fork their workers as they are: on CPython 3.11 such a fork once deadlocked a control
    # run (the after-fork hang the library's loaders avoid). A control shows what a plain resume feeds, so
    # it trains with the library's own guard, garbage collection paused, around the whole run.
    model = Model(config)
    leg = config.get("leg", {}).get("kind")
    if leg == "early":  # a chain's leg that validates and saves before any train step
        trainer.validate(model, datamodule=datamodule, ckpt_path=ckpt_path, verbose=False)
        trainer.save_checkpoint(config["checkpoint"])
    elif leg == "extend":  # a chain's leg that fits to its (earlier) end, then saves once fit() returned
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
        trainer.save_checkpoint(config["checkpoint"])
    else:
        fit(config, trainer, model, datamodule, ckpt_path, trainer_options)
    if torch.distributed.is_initialized():
        # A clean shutdown: left to the interpreter's exit, gloo's threads once aborted a finished run.
        torch.distributed.destroy_process_group()


def fit(
    config: dict[str, Any],
    trainer: L.Trainer,
    model: Model,
    datamodule: Any,
    ckpt_path: str | None,
    trainer_options: dict[str, Any],
) -> None:
    if ckpt_path is not None and config.get("evaluate_before_resume"):
        # As a user checks a checkpoint before resuming it, on the same trainer: none reads the train stream.
        trainer.validate(model, datamodule=datamodule, ckpt_path=ckpt_path, verbose=False)
        trainer.test(model, datamodule=datamodule, ckpt_path=ckpt_path, verbose=False)
        trainer.predict(model, datamodule=datamodule, ckpt_path=ckpt_path)
    with nullcontext() if config["resumable"] else garbage_collector_paused():
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    if config["phase"].startswith("resume") and config.get("evaluate_after_fit"):
        evaluate_after_fit(config, trainer, model, datamodule, trainer_options)


if __name__ == "__mp_main__":  # a loader worker started by spawn, or the forkserver, importing the main module
    from processes import dump_stacks_if_asked

    dump_stacks_if_asked()

if __name__ == "__main__":
    from processes import dump_stacks_on_signal  # this script's folder is first on sys.path

    dump_stacks_on_signal(Path(json.loads(Path(sys.argv[1]).read_text())["out_dir"]))
    main(sys.argv[1])
