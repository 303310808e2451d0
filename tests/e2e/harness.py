"""Runs the three phases of a scenario (straight through, stopped, resumed) and compares the streams."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any

from .data_setups import MIXTURE_SOURCES, MIXTURE_WEIGHTS, SETUPS
from .processes import ForkServer, run_tree

TRAIN_SCRIPT = Path(__file__).with_name("train.py")
RUN_TIMEOUT_S = int(os.environ.get("E2E_RUN_TIMEOUT_S", "300"))
FORK = os.environ.get("E2E_FORK_SERVER", "1") == "1"
"""Whether `run_phase` starts its runs from the fork server (the default) or as ``python train.py``."""
_server: ForkServer | None = None


def fork_server() -> ForkServer:
    """The session's fork server, started at its first run."""
    global _server
    if _server is None:
        _server = ForkServer(Path(tempfile.mkdtemp(prefix="forkserver-")) / "server.log")
        atexit.register(_server.close)
    return _server


Records = dict[int, list[dict[str, Any]]]
"""Per rank, the completed training steps in order: epoch, batch index, sample ids, augmentation
values and loss."""
FIELDS = ("epoch", "batch", "ids", "aug", "loss", "level", "weights", "asked", "changes")
WITH_PARAMETERS = (*FIELDS, "params")
"""The fields and the parameters' digest after each step (recorded on one and two processes, where they are
bit for bit): the workflow matrix compares them too, so the last step's update is compared as well."""
LOSS_TOLERANCE = 1e-5
"""Relative, for losses of runs on three or more processes, where DDP reduces a resumed run's first
step to other bits (test_ddp_first_step.py; docs/guarantees.md); bit for bit on one and two."""


@dataclass(frozen=True)
class Scenario:
    """One training setup and where its stopped run saves and ends.

    ``stop_kind``: ``batch_end`` (in ``on_train_batch_end``), ``last_batch`` (the same on the last
    batch of the epoch), ``in_step`` (inside ``training_step``; the resume re-runs that batch),
    ``validation`` (at the end of a mid-epoch validation). ``estimated_stepping_batches`` makes
    ``configure_optimizers`` read it, which builds the loaders before the checkpoint is restored.
    ``callback_options`` are ``ResumableDataCallback``'s keyword arguments; they change the stream,
    so scenarios share runs only with equal options. ``relist_on_resume`` makes the resumed run's
    dataset read its rows in another order (its stopped and uninterrupted runs are the base ones).
    ``curriculum`` trains on a dataset with state of its own, a level raised at each epoch's end.
    ``sampler`` is ``shuffle`` (the ``shuffle`` flag) or a standard sampler: ``weighted``,
    ``replacement``, ``num_samples``, ``subset`` (see ``train.make_sampler``), or the batch sampler
    ``bucketing`` (``train.Bucketing``).
    ``data`` is ``map`` (one map-style loader), ``stream`` (``train.ShardedStream``, a user's stateful
    stream), ``hf`` (a Hugging Face ``datasets.IterableDataset``; ``hf-arrow`` read as Arrow tables, ``hf-interleaved``
    two of them interleaved: `train.hf_interleaved_stream`), ``wds`` (a ``wds.WebDataset`` over tar
    shards; ``shuffle_buffer`` is its ``.shuffle(n)`` as it is ``hf``'s ``buffer_size``), ``litdata`` (LitData's
    ``StreamingDataLoader`` over a ``StreamingDataset``; `train.write_litdata` writes its chunks),
    ``litdata-combined`` (a ``CombinedStreamingDataset`` of it and a second one of 24 samples),
    ``mosaic`` (the same with MosaicML Streaming; `train.write_mosaic` writes its shards),
    ``combined`` (a ``CombinedLoader`` of two map-style loaders of different lengths in ``mode``) or
    ``dict`` (the same two loaders as a plain dict, which Lightning combines in ``max_size_cycle``
    mode). ``resume_num_workers`` resumes with another number of workers. ``stop_batch_override``
    stops at that batch instead of the default.
    ``in_validation`` saves inside the validation after the stop batch, after its second batch.
    ``monitor`` adds ``ModelCheckpoint(monitor="val_loss")``, a ``ModelCheckpoint`` of the newest and
    ``EarlyStopping``: a ``validation`` stop then resumes from the checkpoint the newest one wrote at the
    stop batch's validation, the run killed at the next training batch; each run records what they chose.
    ``mixture`` data is a ``Mixture`` of ``mixture_sources`` (name, size) with the schedule
    ``mixture_weights`` (``(step, weights)`` changes); ``resume_mixture_sources`` and
    ``resume_mixture_weights`` replace them in the resumed run (the weights changed at a resume).
    ``extra_saves_every``: the stopped and resumed runs also save a checkpoint every so many optimizer
    steps (``trainer.save_checkpoint`` in ``on_train_batch_end``), which must change nothing.
    ``strategy`` is ``ddp``, ``model_parallel`` (``ModelParallelStrategy``, FSDP2's ``fully_shard`` in
    ``configure_model``, a full checkpoint) or ``model_parallel_sharded`` (the same with a distributed,
    sharded checkpoint: a directory).
    ``online_mixing``: every so many batches of an epoch the training sets the mixture's weights from each
    source's mean loss (`train.reweighted`); ``online_in_validation`` also sets them in every validation;
    ``online_disagree`` makes rank 1 ask for other weights than rank 0. ``val_workers``: the validation
    loader's workers.
    """

    world_size: int
    num_workers: int = 0
    loader: str = "DataLoader"
    shuffle: bool = True
    drop_last: bool = False
    stop_kind: str = "batch_end"
    estimated_stepping_batches: bool = False
    resumable: bool = True
    persistent_workers: bool = False
    dataset_size: int = 38
    batch_size: int = 4
    epochs: int = 3
    stop_epoch: int = 1
    seed: int | None = 1234
    resume_world_size: int | None = None
    callback_options: tuple[tuple[str, bool], ...] = ()
    relist_on_resume: bool = False
    curriculum: bool = False
    sampler: str = "shuffle"
    data: str = "map"
    mode: str = "max_size_cycle"
    resume_num_workers: int | None = None
    resume_batch_size: int | None = None
    """The resume's batch size per process (``None``: the same)."""
    stop_batch_override: int | None = None
    accumulate: int = 1
    evaluate_before_resume: bool = False
    evaluate_after_fit: bool = False
    resume_drop_last: bool | None = None
    shuffle_buffer: int = 0
    val_check_interval: float = 2
    check_val_every_n_epoch: int | None = 1
    max_steps: int = -1
    val_size: int = 8
    limit_val_batches: int = 1
    monitor: bool = False
    strategy: str = "ddp"
    augment: str = ""  # a map-style dataset of images augmented by a library (train.py: AugmentedImages)
    mixture_sources: tuple[tuple[str, int], ...] = MIXTURE_SOURCES
    mixture_weights: tuple[tuple[int, tuple[tuple[str, float], ...]], ...] = MIXTURE_WEIGHTS
    resume_mixture_sources: tuple[tuple[str, int], ...] | None = None
    resume_mixture_weights: tuple[tuple[int, tuple[tuple[str, float], ...]], ...] | None = None
    extra_saves_every: int = 0
    limit_train_batches: int | None = None
    manual_optimization: bool = False
    val_loader: str = "plain"
    online_mixing: int = 0
    online_in_validation: bool = False
    online_disagree: bool = False
    val_workers: int = 0
    wds_form: str = ""
    """A ``wds`` pipeline's form (`train.WDS_FORMS`): ``""`` batched by the loader, or batched in the pipeline."""
    start_method: str = "fork"
    """How loader workers start (`train.use_start_method`): ``fork``, ``forkserver`` or ``spawn`` given to each
    loader, or ``default:forkserver`` / ``default:spawn`` set as the process default (Python 3.14's)."""
    stream_order: tuple[int, int, int] | None = None
    """The layout ``(world_size, num_workers, batch_size)`` the ``hf`` or ``wds`` stream declares as its order
    (``resumable_stream_order``; the first launch's): every epoch is read in its global order, on any layout (a judge:
    `matrix.ordered_mismatches`). A pipeline batched in itself declares its batch size ``None``."""
    wds_refused: str = ""
    """A stage the docs list as refused added to the ``wds`` pipeline (`train.WDS_REFUSED`): every run of it must
    fail before any step with an ``UnsupportedLoaderError`` naming it."""

    @property
    def batches_per_epoch(self) -> int:
        """Batches each rank trains per epoch, as DistributedSampler and DataLoader count them (and
        ``Trainer(limit_train_batches=...)`` cuts them)."""
        natural = SETUPS[self.data].batches_per_epoch(self)
        return natural if self.limit_train_batches is None else min(natural, self.limit_train_batches)

    @property
    def stop_batch(self) -> int:
        if self.stop_batch_override is not None:
            return self.stop_batch_override
        if self.stop_kind == "last_batch":
            return self.batches_per_epoch - 1
        if self.stop_kind in ("validation", "in_validation"):
            return 1  # validation runs after every second batch (val_check_interval=2)
        return min(2, self.batches_per_epoch - 2)  # strictly inside the epoch, never its last batch

    def declaring_its_order(self) -> Scenario:
        """The scenario whose stream declares its first launch's layout as its order (``stream_order``)."""
        return replace(self, stream_order=(self.world_size, self.num_workers, self.batch_size))

    def data_key(self) -> Scenario:
        """The scenario with everything that cannot change the uninterrupted stream normalised."""
        persistent = self.persistent_workers and self.num_workers > 0
        # A distributed checkpoint is another file layout of the same training.
        strategy = "model_parallel" if self.strategy == "model_parallel_sharded" else self.strategy
        # The library reads a stream through its own loader, whichever class the user returned.
        loader = "DataLoader" if SETUPS[self.data].own_loader and self.resumable else self.loader
        return replace(
            self,
            loader=loader,
            strategy=strategy,
            stop_kind="batch_end",
            stop_epoch=1,
            estimated_stepping_batches=False,  # changes when loaders are built, not what they yield
            resume_world_size=None,
            resume_num_workers=None,
            resume_batch_size=None,
            stop_batch_override=None,
            relist_on_resume=False,
            persistent_workers=persistent,
            evaluate_before_resume=False,
            evaluate_after_fit=False,
            resume_drop_last=None,
            resume_mixture_sources=None,
            resume_mixture_weights=None,
            extra_saves_every=0,  # saves change nothing: the uninterrupted run makes none
            start_method="fork",  # how workers start changes nothing they read: one uninterrupted run for all
            stream_order=None,  # the order declared is the uninterrupted run's own layout's
        )

    def stop_key(self) -> Scenario:
        """The scenario with what only the resume changes normalised: its stopped run is shared."""
        return replace(
            self,
            resume_world_size=None,
            resume_num_workers=None,
            resume_batch_size=None,
            relist_on_resume=False,
            evaluate_before_resume=False,
            evaluate_after_fit=False,
            resume_drop_last=None,
            resume_mixture_sources=None,
            resume_mixture_weights=None,
            stream_order=None,  # the order declared is the stopped run's own layout's
        )

    def label(self) -> str:
        parts = [
            f"W{self.world_size}" + (f"to{self.resume_world_size}" if self.resume_world_size else ""),
            f"workers{self.num_workers}",
            self.loader,
            "shuffle" if self.shuffle else "sequential",
            "droplast" if self.drop_last else "keeplast",
            self.stop_kind,
        ]
        if self.persistent_workers:
            parts.insert(2, "persistent")
        if self.start_method != "fork":
            parts.insert(2, self.start_method.replace("default:", "default-"))
        if self.estimated_stepping_batches:
            parts.append("est_steps")
        parts += [f"{name}={value}" for name, value in self.callback_options]
        if self.relist_on_resume:
            parts.append("relisted")
        if self.curriculum:
            parts.append("curriculum")
        if self.sampler != "shuffle":
            parts.append(self.sampler)
        if self.augment:
            parts.append(self.augment)
        if self.data != "map":
            parts.append(SETUPS[self.data].label(self))
        if self.resume_num_workers is not None:
            parts.append(f"resume-workers{self.resume_num_workers}")
        if self.resume_batch_size is not None:
            parts.append(f"resume-batch{self.resume_batch_size}")
        if self.stop_batch_override is not None:
            parts.append(f"stop{self.stop_batch_override}")
        if self.accumulate != 1:
            parts.append(f"accumulate{self.accumulate}")
        if self.evaluate_before_resume:
            parts.append("evaluated-first")
        if self.evaluate_after_fit:
            parts.append("evaluated-after")
        if self.resume_drop_last is not None:
            parts.append(f"resume-droplast{self.resume_drop_last}")
        mixture = (self.mixture_sources, self.mixture_weights, self.resume_mixture_sources, self.resume_mixture_weights)
        if self.data == "mixture" or mixture != (MIXTURE_SOURCES, MIXTURE_WEIGHTS, None, None):
            parts.append("mix" + hashlib.blake2b(repr(mixture).encode(), digest_size=4).hexdigest())
        if not self.resumable:
            parts.append("CONTROL")
        # Every other field that differs from its default: two scenarios never share a run directory.
        parts += [
            f"{field.name}={getattr(self, field.name)}"
            for field in dataclass_fields(self)
            if field.name not in _NAMED_IN_LABEL and getattr(self, field.name) != field.default
        ]
        label = "-".join(parts)
        if len(label) <= _LONGEST_LABEL:
            return label
        # A run directory is named by its label, and a file name holds 255 bytes (a soak's case of 265 failed to
        # make its directory): cut, with a digest of the whole that keeps two scenarios apart.
        return label[: _LONGEST_LABEL - 17] + "-" + hashlib.blake2b(label.encode(), digest_size=8).hexdigest()


_LONGEST_LABEL = 200
"""Of a scenario's label (`Scenario.label`): the run directories it names get a prefix (``full-``, ``exit-``...)."""


_NAMED_IN_LABEL = {
    "world_size", "resume_world_size", "num_workers", "loader", "shuffle", "drop_last", "stop_kind",
    "persistent_workers", "estimated_stepping_batches", "callback_options", "relist_on_resume", "curriculum",
    "sampler", "data", "resume_num_workers", "resume_batch_size", "stop_batch_override", "accumulate",
    "evaluate_before_resume", "evaluate_after_fit", "resume_drop_last", "resumable", "mixture_sources",
    "mixture_weights", "resume_mixture_sources", "resume_mixture_weights",
}  # fmt: skip
"""The fields `Scenario.label` spells out in its own words (``mode`` only for ``combined`` data)."""


def _config(scenario: Scenario, phase: str, run_dir: Path, checkpoint: Path, world_size: int) -> dict[str, Any]:
    config = asdict(scenario)
    config.update(
        phase=phase,
        out_dir=str(run_dir),
        checkpoint=str(checkpoint),
        world_size=world_size,
        first_world_size=scenario.world_size,  # the world size before a resume on another one
        stop={"kind": scenario.stop_kind, "epoch": scenario.stop_epoch, "batch": scenario.stop_batch, "val_batch": 1},
    )
    if phase.startswith("resume") and scenario.resume_batch_size is not None:
        config["batch_size"] = scenario.resume_batch_size
    return config


def run_phase(
    scenario: Scenario,
    phase: str,
    run_dir: Path,
    checkpoint: Path,
    world_size: int | None = None,
    expect_failure: bool = False,
    fork: bool = FORK,
    timeout: float = RUN_TIMEOUT_S,
) -> Records:
    """Run one phase as a fresh process tree and return what each rank recorded.

    With ``expect_failure`` the phase must exit non-zero (within the timeout: no rank may hang). With
    ``fork=False`` it runs as ``python train.py`` and ends by a normal interpreter exit (a forked run
    ends with ``os._exit``, which would not wait for a loader worker left running).
    """
    world_size = world_size or scenario.world_size
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir / f"{phase}.json"
    config_path.write_text(json.dumps(_config(scenario, phase, run_dir, checkpoint, world_size)))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log_path = run_dir / f"{phase}.log"
    what = f"{scenario.label()} phase {phase}"
    if fork:
        returncode = fork_server().run(config_path, world_size, log_path, run_dir, timeout, what)
    else:
        command = [sys.executable, str(TRAIN_SCRIPT), str(config_path)]
        returncode = run_tree(command, log_path, run_dir, timeout, what, env)
    if expect_failure:
        if returncode == 0:
            raise AssertionError(f"{scenario.label()} phase {phase} was expected to fail and exited 0")
        return read_records(run_dir, phase, world_size)
    if returncode != 0:
        raise AssertionError(f"{scenario.label()} phase {phase} exited {returncode}:\n{log_path.read_text()[-4000:]}")
    if phase == "stop" and not checkpoint.exists():
        raise AssertionError(f"{scenario.label()}: the stopped run wrote no checkpoint\n{log_path.read_text()[-4000:]}")
    return read_records(run_dir, phase, world_size)


EXIT_TIMEOUT_S = 150
"""An uninterrupted run of a few dozen steps ends well within this, imports included, on 2 busy cores."""


def check_run_exits(root: Path, scenario: Scenario) -> None:
    """Train ``scenario`` uninterrupted as ``python train.py``, stopped by ``max_steps`` inside an epoch
    (its loader's iterator not exhausted, its workers still running), and require the processes to
    end by a normal interpreter exit within `EXIT_TIMEOUT_S`: else each one's stack is printed and the
    whole tree killed. The run's data sits in ``root`` (LitData's and Mosaic's shards)."""
    steps = scenario.batches_per_epoch + 2
    ending = replace(scenario, max_steps=steps, epochs=2)
    run_dir = root / ("exit-" + ending.label())
    records = run_phase(ending, "full", run_dir, run_dir / "unused.ckpt", fork=False, timeout=EXIT_TIMEOUT_S)
    assert [len(each) for each in records.values()] == [steps] * scenario.world_size, "the run trained to max_steps"


def read_records(run_dir: Path, phase: str, world_size: int) -> Records:
    records: Records = {}
    for rank in range(world_size):
        path = run_dir / f"{phase}.rank{rank}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        records[rank] = [json.loads(line) for line in lines]
    return records


def read_validations(run_dir: Path, phase: str, world_size: int) -> Records:
    """Per rank, the validations a phase completed: global step, epoch, batches, ``val_loss`` (bits)."""
    return read_records(run_dir, phase + ".val", world_size)


def read_choices(run_dir: Path, phase: str, world_size: int) -> dict[int, dict[str, Any] | None]:
    """Per rank, what ``ModelCheckpoint(monitor=...)`` and ``EarlyStopping`` held at the fit's end."""
    paths = {rank: run_dir / f"{phase}.choices.rank{rank}.json" for rank in range(world_size)}
    return {rank: json.loads(path.read_text()) if path.exists() else None for rank, path in paths.items()}


@dataclass
class Outcome:
    scenario: Scenario
    full: Records
    stopped: Records
    resumed: Records

    def exact_losses(self) -> bool:
        """Whether losses must be bit-identical: on fewer than three processes before and after the stop."""
        return max(self.scenario.world_size, self.scenario.resume_world_size or 0) < 3

    def _same(self, name: str, want: Any, got: Any) -> bool:
        if name == "loss" and not self.exact_losses() and isinstance(want, float) and isinstance(got, float):
            return math.isclose(want, got, rel_tol=LOSS_TOLERANCE)
        return bool(want == got)

    def stream_mismatches(self, fields: Sequence[str] = FIELDS) -> list[str]:
        """Per rank, where stopped + resumed steps differ from the uninterrupted steps in ``fields`` (empty:
        exact; losses on three or more processes to `LOSS_TOLERANCE`)."""
        problems = []
        for rank, full_steps in self.full.items():
            expected = [{name: step.get(name) for name in fields} for step in full_steps]
            actual = [{name: step.get(name) for name in fields} for step in self.stopped[rank] + self.resumed[rank]]
            if not self.stopped[rank] or not self.resumed[rank]:
                problems.append(
                    f"rank {rank}: {len(self.stopped[rank])} steps before the stop and"
                    f" {len(self.resumed[rank])} after: the scenario did not stop and resume mid-run"
                )
            for step, (want, got) in enumerate(zip(expected, actual, strict=False)):
                differing = [name for name in fields if not self._same(name, want.get(name), got.get(name))]
                if differing:
                    problems.append(f"rank {rank} step {step} differs in {differing}: expected {want}, got {got}")
                    break
            if len(expected) != len(actual):
                problems.append(f"rank {rank}: expected {len(expected)} steps, got {len(actual)}")
        return problems

    def validation_mismatches(self, runner: Runner) -> list[str]:
        """Per rank, where the validations of the stopped and the resumed run differ from the uninterrupted
        run's (global step, epoch, batches seen, ``val_loss`` bits), and where ``ModelCheckpoint`` and
        ``EarlyStopping`` chose otherwise at the end of the fit."""
        full, stopped, resumed = runner.validations(self.scenario)
        problems = []
        for rank, expected in full.items():
            actual = stopped[rank] + resumed[rank]
            if not expected:
                problems.append(f"rank {rank}: the uninterrupted run validated nothing")
            for index, (want, got) in enumerate(zip(expected, actual, strict=False)):
                same_loss = self._same("loss", want.get("val_loss"), got.get("val_loss"))  # bits on 1 and 2 processes
                if not same_loss or {**want, "val_loss": None} != {**got, "val_loss": None}:
                    problems.append(f"rank {rank} validation {index} differs: expected {want}, got {got}")
                    break
            if len(expected) != len(actual):
                steps = [entry["step"] for entry in actual]
                problems.append(
                    f"rank {rank}: expected {len(expected)} validations at steps {[e['step'] for e in expected]},"
                    f" got {len(actual)} at {steps}"
                )
        full_choices, resumed_choices = runner.choices(self.scenario)
        for rank, want in full_choices.items():
            if want != resumed_choices.get(rank):
                problems.append(f"rank {rank}: at the end, expected {want}, got {resumed_choices.get(rank)}")
        return problems

    def differing_fields(self) -> set[str]:
        """The record fields that differ between the uninterrupted and the stopped + resumed steps, and
        ``"steps"`` if a rank trained another number of steps."""
        differing = set()
        for rank, expected in self.full.items():
            actual = self.stopped[rank] + self.resumed[rank]
            if len(actual) != len(expected):
                differing.add("steps")
            for want, got in zip(expected, actual, strict=False):
                differing |= {name for name in FIELDS if not self._same(name, want.get(name), got.get(name))}
        return differing


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Held by one process of the machine at a time (pytest-xdist's workers share the runner's folder)."""
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released as the file closes (or its process ends)
        yield


def run_once(run_dir: Path, phase: str, world_size: int, run: Callable[[], Records]) -> Records:
    """``run()``'s records, run by the first pytest process of the session to ask for ``phase`` in ``run_dir``; a
    later one (another xdist worker) waits on the directory's lock and reads what the run recorded. A run that
    failed left no mark: the next to ask runs it again (and fails as it did)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with locked(run_dir / f"{phase}.lock"):
        done = run_dir / f"{phase}.done"
        if done.exists():
            return read_records(run_dir, phase, world_size)
        records = run()
        done.touch()
        return records


class Runner:
    """Runs scenarios, sharing one uninterrupted run among scenarios with the same data setup and one
    stopped run among resumes of the same scenario on different world sizes: across the pytest-xdist workers
    of a session too (they share ``root``; each phase runs once, under its directory's lock)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._full: dict[Scenario, Records] = {}
        self._stopped: dict[Scenario, Records] = {}
        self._resumed: dict[tuple[Scenario, int], Records] = {}
        self._outcomes: dict[Scenario, Outcome] = {}

    def full(self, scenario: Scenario) -> Records:
        key = scenario.data_key()
        if key not in self._full:
            run_dir = self.root / ("full-" + key.label())
            self._full[key] = run_once(
                run_dir, "full", key.world_size, lambda: run_phase(key, "full", run_dir, run_dir / "unused.ckpt")
            )
        return self._full[key]

    def full_validations(self, scenario: Scenario) -> Records:
        """The validations of the scenario's uninterrupted run (run first if it has not been)."""
        self.full(scenario)
        key = scenario.data_key()
        return read_validations(self.root / ("full-" + key.label()), "full", scenario.world_size)

    def stopped(self, scenario: Scenario) -> Records:
        key = scenario.stop_key()
        if key not in self._stopped:
            run_dir = self.root / key.label()
            self._stopped[key] = run_once(
                run_dir, "stop", key.world_size, lambda: run_phase(key, "stop", run_dir, self.checkpoint(key))
            )
        return self._stopped[key]

    def _phase_dirs(self, scenario: Scenario) -> tuple[tuple[Path, str], tuple[Path, str], tuple[Path, str]]:
        world_size = scenario.resume_world_size or scenario.world_size
        return (
            (self.root / ("full-" + scenario.data_key().label()), "full"),
            (self.root / scenario.stop_key().label(), "stop"),
            (self.root / scenario.label(), f"resume-on-{world_size}-attempt1"),
        )

    def validations(self, scenario: Scenario) -> tuple[Records, Records, Records]:
        """The validations of the scenario's uninterrupted, stopped and (first) resumed run."""
        self.run(scenario)
        sizes = (scenario.world_size, scenario.world_size, scenario.resume_world_size or scenario.world_size)
        full, stopped, resumed = (
            read_validations(run_dir, phase, size)
            for (run_dir, phase), size in zip(self._phase_dirs(scenario), sizes, strict=True)
        )
        return full, stopped, resumed

    def choices(self, scenario: Scenario) -> tuple[dict[int, Any], dict[int, Any]]:
        """What the uninterrupted and the resumed run's monitoring callbacks chose (``None`` without them)."""
        (full_dir, full_phase), _, (resumed_dir, resumed_phase) = self._phase_dirs(scenario)
        size = scenario.resume_world_size or scenario.world_size
        return read_choices(full_dir, full_phase, scenario.world_size), read_choices(resumed_dir, resumed_phase, size)

    def checkpoint(self, scenario: Scenario) -> Path:
        return self.root / scenario.stop_key().label() / "stop.ckpt"

    def resumed(self, scenario: Scenario, attempt: int = 1, expect_failure: bool = False) -> Records:
        """Resume the scenario's stopped run; each ``attempt`` is a run of its own, run once."""
        if (scenario, attempt) not in self._resumed:
            self.stopped(scenario)
            run_dir = self.root / scenario.label()
            phase = f"resume-on-{scenario.resume_world_size or scenario.world_size}-attempt{attempt}"
            self._resumed[scenario, attempt] = run_once(
                run_dir,
                phase,
                scenario.resume_world_size or scenario.world_size,
                lambda: run_phase(
                    scenario, phase, run_dir, self.checkpoint(scenario), scenario.resume_world_size, expect_failure
                ),
            )
        return self._resumed[scenario, attempt]

    def run(self, scenario: Scenario) -> Outcome:
        if scenario not in self._outcomes:
            outcome = Outcome(scenario, self.full(scenario), self.stopped(scenario), self.resumed(scenario))
            self._outcomes[scenario] = outcome
        return self._outcomes[scenario]


def global_order(records: Records, epoch: int) -> list[int]:
    """The epoch's samples in their global order: step after step, and in a step as ``DistributedSampler`` deals
    global positions (its ranks' i-th samples, rank after rank)."""
    steps: dict[int, list[list[int]]] = {}
    for rank in sorted(records):
        for record in records[rank]:
            if record["epoch"] == epoch:
                steps.setdefault(record["batch"], []).append(record["ids"])
    order = []
    for step in sorted(steps):
        order += [ids[i] for i in range(max(map(len, steps[step]))) for ids in steps[step] if i < len(ids)]
    return order


def ids_in_epoch(records: Records, epoch: int) -> list[int]:
    """Every sample id the ranks trained in ``epoch``, rank after rank."""
    return [i for rank_records in records.values() for r in rank_records if r["epoch"] == epoch for i in r["ids"]]


def data_after_epoch(records: Records, epoch: int) -> dict[int, list[tuple[object, ...]]]:
    """Per rank, what each later step read: epoch, batch, ids and augmentations (not the loss)."""
    return {
        rank: [(r["epoch"], r["batch"], r["ids"], r["aug"]) for r in rank_records if r["epoch"] > epoch]
        for rank, rank_records in records.items()
    }


def augmentation_by_id(*runs: Records, epoch: int) -> dict[int, list[list[float]]]:
    """Sample id -> its augmentations in the epoch, in the order of ``runs`` (padding repeats an id)."""
    found: dict[int, list[list[float]]] = {}
    for rank_records in (records for run in runs for records in run.values()):
        for record in rank_records:
            if record["epoch"] == epoch:
                for sample, values in zip(record["ids"], record["aug"], strict=True):
                    found.setdefault(sample, []).append(values)
    return found


def stream_order(records: Records) -> list[tuple[int, list[float]]]:
    """Every rank's samples in stream order, with their augmentations: each global batch is rank 0's
    batch, then rank 1's, ..."""
    ordered = []
    for steps in zip(*(records[rank] for rank in sorted(records)), strict=True):
        ordered += [(sample, values) for step in steps for sample, values in zip(step["ids"], step["aug"], strict=True)]
    return ordered


def resume_damaged(runner: Runner, scenario: Scenario, tmp_path: Path, damage: Callable[[dict[str, Any]], None]) -> str:
    """Resume ``scenario``'s stopped run from its checkpoint after ``damage(checkpoint)``; the run must
    fail before any step trains. Returns its log."""
    import torch

    runner.stopped(scenario)
    checkpoint = torch.load(runner.checkpoint(scenario), weights_only=True)
    damage(checkpoint)
    damaged = tmp_path / "damaged.ckpt"
    torch.save(checkpoint, damaged)
    resumed = run_phase(
        scenario, "resume-damaged", tmp_path / "run", damaged, scenario.resume_world_size, expect_failure=True
    )
    assert not any(resumed.values()), "a resumed step trained"
    return (tmp_path / "run" / "resume-damaged.log").read_text()


def stream_state(checkpoint: dict[str, Any]) -> dict[str, Any]:
    state: dict[str, Any] = checkpoint["callbacks"]["ResumableDataCallback"]["state"]
    return state
