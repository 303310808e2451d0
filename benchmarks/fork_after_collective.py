"""How often a fork right after a gloo collective deadlocks its child (CPython gh-112275), with and
without the library's guard: ``python benchmarks/fork_after_collective.py [FORKS]``.

2 gloo ranks (CPU) each run FORKS rounds of ``all_gather_object`` then ``os.fork()`` of a child that
exits at once, first unguarded, then inside `lightning_resumable.readers.quiet_fork.guarded_forks`
(the wait for quiet native threads that the library's loaders fork under). A child that has not
exited 5 s later is stuck in the after-fork cleanup, before any Python code of its own: it is counted
and killed. Prints one row per rank and mode: forks, stuck children, forks that waited, time.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from contextlib import AbstractContextManager, nullcontext

import torch.distributed as dist
import torch.multiprocessing as mp

from lightning_resumable.readers.quiet_fork import affected_python, guarded_forks, running_native_threads

WORLD_SIZE, STUCK_AFTER_S = 2, 5.0


def fork_a_child_that_exits() -> bool:
    """Whether the child exited (else it was stuck, and is killed)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    deadline = time.monotonic() + STUCK_AFTER_S
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0]:
            return True
        time.sleep(0.001)  # polling a child's exit: the child's own exit is what is measured
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return False


def rounds(rank: int, forks: int, guard: bool) -> str:
    stuck = waited = 0
    started = time.perf_counter()
    for index in range(forks):
        gathered: list[object] = [None] * WORLD_SIZE
        dist.all_gather_object(gathered, {"round": index, "rank": rank})
        waited += bool(guard and running_native_threads())
        block: AbstractContextManager[None] = guarded_forks() if guard else nullcontext()
        with block:
            stuck += not fork_a_child_that_exits()
    seconds = time.perf_counter() - started
    mode = "guarded" if guard else "unguarded"
    return f"| {rank} | {mode} | {forks} | {stuck} | {waited if guard else '-'} | {seconds:.1f} |"


def run(rank: int, forks: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    rows = [rounds(rank, forks, guard=False), rounds(rank, forks, guard=True)]
    gathered: list[object] = [None] * WORLD_SIZE
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        print("| rank | fork | forks | stuck children | forks that waited | s |")
        print("|---|---|---|---|---|---|")
        for part in gathered:
            print("\n".join(part))  # type: ignore[arg-type]
    dist.destroy_process_group()


if __name__ == "__main__":
    if not affected_python():
        sys.exit(f"CPython {sys.version.split()[0]} has the fix of gh-112275: nothing to measure")
    mp.spawn(run, args=(int(sys.argv[1]) if len(sys.argv) > 1 else 5000, 29533), nprocs=WORLD_SIZE)
