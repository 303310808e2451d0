"""Preempt a 2-process DDP run as a cluster does, in its first epoch, and verify the resume on every rank.

Run: ``python examples/preemption.py`` (``--runs 20`` repeats the preemption; ``--data mixture`` trains on a
``Mixture`` of two chunked sources instead of a shuffled map-style dataset; ``--start-method`` starts the
loader workers by ``fork``, ``forkserver`` or ``spawn`` given as the loaders' ``multiprocessing_context``, or
by the process ``default``, set to ``forkserver`` as Python 3.14 sets it). The training is written as a
user writes it: ``DataLoader(..., shuffle=True, num_workers=2)`` from a ``ResumableDataModule``,
``ResumableDataCallback()`` and ``OnExceptionCheckpoint``, ``max_epochs=1``.

Each preempted run starts in a session of its own (``python examples/preemption.py train``, Lightning's
launcher starting the second rank), and a few steps into its first epoch this script signals the whole
process group, ranks and loader workers, as SLURM (``scancel``, a time limit, a preemption) or
``kill -TERM -- -PGID`` does. It then checks, per run: every rank ended through Lightning's
``SIGTERMException`` at the same batch, every process of the group is gone (the time from the signal is
printed), and the checkpoint resumes exactly: each rank's steps before it and after the resume have the
sample ids and the loss bits of the uninterrupted run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import OnExceptionCheckpoint
from torch.utils.data import DataLoader, Dataset

from lightning_resumable import Chunked, Mixture, ResumableDataCallback, ResumableDataModule

WORLD_SIZE = 2
SAMPLES = 480  # 60 steps per rank in the one epoch
BATCH_SIZE = 4
STEP_SECONDS = 0.03  # a step takes time, so the signal lands mid-epoch
EXIT_BOUND_S = 20.0  # a run still alive this long after the signal is a failure (it printed its time)


# ---------------------------------------------------------------------------------- training side
class Samples(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Sample ``index``: its id, and features under a random augmentation (torch's global generator)."""

    def __init__(self, size: int, first_id: int = 0) -> None:
        self.size, self.first_id = size, first_id

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        features = torch.randn(8, generator=torch.Generator().manual_seed(index)) * (0.5 + torch.rand(()))
        return torch.tensor(self.first_id + index), features


class PlainData(L.LightningDataModule):
    """The datamodule as written without the library (``--without-library``: the measurement's control)."""

    def __init__(self, data: str, start_method: str) -> None:
        super().__init__()
        self.data = data
        self.context = None if start_method == "default" else start_method  # None: the process default

    def train_dataloader(self) -> DataLoader[Any]:
        if self.data == "mixture":  # two sources read chunk by chunk (16 samples a chunk), 2:1
            web, code = Chunked(Samples(320), 16), Chunked(Samples(160, first_id=10_000), 16)
            mixture = Mixture({"web": web, "code": code}, {"web": 2, "code": 1})
            return DataLoader(mixture, batch_size=BATCH_SIZE, num_workers=2, multiprocessing_context=self.context)
        return DataLoader(
            Samples(SAMPLES), batch_size=BATCH_SIZE, shuffle=True, num_workers=2, multiprocessing_context=self.context
        )


class Data(ResumableDataModule, PlainData):
    """The two lines: the datamodule made resumable (and ``ResumableDataCallback`` in the trainer)."""


class Model(L.LightningModule):
    def __init__(self, out: str) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
        self.out = out

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        time.sleep(STEP_SECONDS)
        return self.net(batch[1]).pow(2).mean()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        record = {
            "epoch": self.current_epoch,
            "batch": batch_idx,
            "ids": batch[0].tolist(),
            "loss": outputs["loss"].item(),
        }
        with open(f"{self.out}.rank{self.global_rank}.jsonl", "a") as file:  # repr-exact floats: loss bits
            file.write(json.dumps(record) + "\n")

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class HowItEnded(L.Callback):
    """Writes, per rank, the exception the fit ended with and the batches it had trained in its epoch."""

    def __init__(self, out: str) -> None:
        self.out = out

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        done = trainer.fit_loop.epoch_loop.batch_progress.current.completed
        ended = {"exception": type(exception).__name__, "epoch": trainer.current_epoch, "batches": done}
        Path(f"{self.out}.ended.rank{trainer.global_rank}.json").write_text(json.dumps(ended))


def train(out: str, data: str, ckpt_path: str | None, start_method: str, library: bool = True) -> None:
    warnings.filterwarnings("ignore")
    if start_method == "default" and sys.version_info < (3, 14):
        multiprocessing.set_start_method("forkserver", force=True)  # Python 3.14's default on Linux
    L.seed_everything(7, verbose=False)
    torch.set_num_threads(1)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=WORLD_SIZE,
        strategy="ddp",
        max_epochs=1,
        deterministic=True,
        callbacks=[
            *([ResumableDataCallback()] if library else []),
            HowItEnded(out),
            OnExceptionCheckpoint(str(Path(out).parent), "preempted"),
        ],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(Path(out).parent),
    )
    datamodule = Data(data, start_method) if library else PlainData(data, start_method)
    trainer.fit(Model(out), datamodule=datamodule, ckpt_path=ckpt_path)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


# ------------------------------------------------------------------------------------ driver side
Records = dict[int, list[dict[str, Any]]]


def read_records(out: Path) -> Records:
    paths = {rank: Path(f"{out}.rank{rank}.jsonl") for rank in range(WORLD_SIZE)}
    return {
        rank: [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []
        for rank, p in paths.items()
    }


def launch(work: Path, phase: str, args: argparse.Namespace, ckpt_path: Path | None = None) -> subprocess.Popen[bytes]:
    """One training run in a session (and process group) of its own, as a job step."""
    command = [sys.executable, __file__, "train", "--out", str(work / phase), "--data", args.data]
    command += ["--start-method", args.start_method] + (["--without-library"] if args.without_library else [])
    if ckpt_path is not None:
        command += ["--ckpt-path", str(ckpt_path)]
    with (work / f"{phase}.log").open("wb") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def group_members(group: int) -> list[int]:
    """The living (not zombie) processes of process group ``group``, from ``/proc``."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def run_to_the_end(process: subprocess.Popen[bytes], work: Path, phase: str) -> None:
    if process.wait(timeout=600) != 0:
        sys.exit(f"the {phase} run failed; see {work / (phase + '.log')}")


def preempt_once(work: Path, args: argparse.Namespace, at_step: int, full: Records) -> dict[str, Any]:
    """One preempted run and its resume: what happened, and whether it was exact."""
    for stale in work.glob("preempted*"):
        stale.unlink()
    for stale in work.glob("resumed*"):
        stale.unlink()
    run = launch(work, "preempted", args)
    deadline = time.monotonic() + 300
    while len(read_records(work / "preempted")[0]) < at_step:
        if run.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"the run ended before the signal; see {work / 'preempted.log'}")
        time.sleep(0.005)  # polling rank 0's records for the step to signal after
    signalled = time.monotonic()
    os.killpg(run.pid, signal.SIGTERM)  # every process of the job: both ranks and their loader workers
    while group_members(run.pid) and time.monotonic() - signalled < EXIT_BOUND_S:
        time.sleep(0.005)  # polling /proc until the whole tree has exited
    gone_after = time.monotonic() - signalled
    left = group_members(run.pid)
    if left:
        os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    ended = {}
    for rank in range(WORLD_SIZE):
        path = work / f"preempted.ended.rank{rank}.json"
        ended[rank] = json.loads(path.read_text()) if path.exists() else {"exception": "none written"}
    result: dict[str, Any] = {"exit_s": gone_after, "left": left, "ended": ended, "exact": False}
    checkpoint = work / "preempted.ckpt"
    if left or not checkpoint.exists() or args.without_library:  # (without the library: the end only)
        return result
    saved = torch.load(checkpoint, weights_only=False, map_location="cpu")
    result["global_step"] = steps_done = int(saved["global_step"])
    run_to_the_end(launch(work, "resumed", args, checkpoint), work, "resumed")
    preempted, resumed = read_records(work / "preempted"), read_records(work / "resumed")
    result["exact"] = all(
        preempted[rank][:steps_done] == full[rank][:steps_done] and resumed[rank] == full[rank][steps_done:]
        for rank in range(WORLD_SIZE)
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", default="demo", choices=["demo", "train"])
    parser.add_argument("--out")
    parser.add_argument("--data", default="map", choices=["map", "mixture"])
    parser.add_argument("--ckpt-path")
    parser.add_argument("--runs", type=int, default=3, help="preemptions to run (each at a random step)")
    parser.add_argument(
        "--start-method",
        default="fork",
        choices=["fork", "forkserver", "spawn", "default"],
        help="how loader workers start: the loaders' multiprocessing_context, or the process default (forkserver)",
    )
    parser.add_argument(
        "--without-library",
        action="store_true",
        help="the same runs without the library (no resume): how each ends, and the time from the signal to the exit",
    )
    args = parser.parse_args()
    if args.mode == "train":
        train(args.out, args.data, args.ckpt_path, args.start_method, library=not args.without_library)
        return

    steps = SAMPLES // BATCH_SIZE // WORLD_SIZE
    print(
        f"{WORLD_SIZE} DDP processes (gloo, CPU), {args.data} data, batch {BATCH_SIZE}, num_workers=2 started by"
        f" {args.start_method}, one epoch of"
    )
    print(f"{steps} steps; each run is signalled (the whole process group) at a random step of its first epoch.")
    draw = random.Random(os.environ.get("PREEMPTION_SEED"))
    rows, all_good, times = [], True, []
    with tempfile.TemporaryDirectory(prefix="preemption_") as tmp:
        work = Path(tmp)
        run_to_the_end(launch(work, "full", args), work, "full")
        full = read_records(work / "full")
        for number in range(1, args.runs + 1):
            at_step = draw.randint(2, steps - 10)
            result = preempt_once(work, args, at_step, full)
            ended = result["ended"]
            same_end = len({(each.get("epoch"), each.get("batches")) for each in ended.values()}) == 1
            clean = all(each["exception"] == "SIGTERMException" for each in ended.values()) and same_end
            good = clean and not result["left"] and result["exact"]
            all_good &= good
            times.append(result["exit_s"])
            how = ", ".join(
                f"rank {rank}: {each['exception']} after {each.get('batches')}" for rank, each in ended.items()
            )
            rows.append(
                f"  {number:>3}  {at_step:>11}  {how:<62}  {result['exit_s']:>6.2f} s  "
                f"{result.get('global_step', '-')!s:>5}  {'exact' if result['exact'] else 'NOT EXACT'}"
                + ("" if not result["left"] else f"  LEFT RUNNING: {result['left']}")
            )
    print(
        "  run  signal after  how each rank ended                                              exit       ckpt   resume"
    )
    print("\n".join(rows))
    print(f"signal to exit: median {statistics.median(times):.2f} s, max {max(times):.2f} s")
    if args.without_library:
        ended = sum("SIGTERMException" in row and "RuntimeError" not in row and "LEFT" not in row for row in rows)
        print(f"WITHOUT THE LIBRARY: {ended}/{args.runs} runs ended with SIGTERMException on every rank (not resumed)")
        return
    if all_good:
        print(f"VERDICT: EXACT - {args.runs}/{args.runs} runs ended on every rank with SIGTERMException at one batch,")
        print("every process gone, and a checkpoint that resumed with the ids and loss bits of the uninterrupted run.")
    else:
        print("VERDICT: FAILED - a run did not end cleanly or did not resume exactly.")
        sys.exit(1)


if __name__ == "__main__":
    main()
