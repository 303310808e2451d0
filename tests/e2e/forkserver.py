"""A fork server for the suite's training runs: ``python forkserver.py``.

Importing torch and Lightning takes about four seconds a process, longer than most of the suite's
runs train. This process imports them once and then, per request, forks a fresh process tree that
runs ``train.main``: a run still starts from a process of its own, with the library's state untouched,
and ends as a finished process ends (`_exit_as_the_interpreter_does`: its threads joined, its
``atexit`` handlers run, multiprocessing's joining the loader workers left), but without paying for
the imports. A stopped run ends with ``os._exit`` from ``train.py``, as a kill would.

The server runs no torch operation and starts no thread, so a fork from it copies one thread and no
thread pool (the conditions under which a fork is safe, CPython gh-112275 included).

Protocol, one JSON object per line: the request on stdin is ``{"config": PATH, "world_size": W,
"log": PATH, "cwd": DIR, "env": {...}}``. The answer on stdout is ``{"pid": LEADER}`` at once, then
``{"exit": CODE}`` when the leader has ended (a negative code: killed by that signal). The leader is
rank 0 in a session of its own; it forks ranks ``1..W-1`` into its process group, as Lightning's
launcher would start them, with the environment of an externally launched DDP run.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import train  # (torch, Lightning, the library: imported once, here)
from processes import dump_stacks_on_signal, free_port

if __name__ == "__main__":  # (not in a worker started by spawn, which runs this module as ``__mp_main__``)
    with contextlib.suppress(ImportError):  # the ``hf`` scenarios' data
        import datasets  # noqa: F401


RANKS_GRACE_S = 30.0
"""After rank 0 fails, how long the other ranks may take to end and print their own failure."""


def _report(*exc_info: Any) -> None:
    """Print an exception as the interpreter would at a process's end: through ``sys.excepthook``, which
    torch.distributed replaces with one that prefixes each line with ``[rankN]:``."""
    try:
        sys.excepthook(*exc_info)
    except BaseException:
        traceback.print_exception(*exc_info)


def _exit_as_the_interpreter_does(code: int) -> None:
    """End a forked run as a finished ``python train.py`` ends: the interpreter's last steps (non-daemon
    threads joined, then the ``atexit`` handlers, among them multiprocessing's, which joins every
    loader worker still running), then ``os._exit``: a fork must not return into the server. A worker
    never shut down hangs here as it would there, and the harness's timeout prints every stack."""
    threading._shutdown()  # type: ignore[attr-defined]  # what Py_FinalizeEx calls first
    atexit._run_exitfuncs()
    os._exit(code)


def _run_rank(request: dict[str, Any], rank: int) -> None:
    """In a forked process: train rank ``rank`` and end the process (never return into the server)."""
    code = 0
    try:
        if request["world_size"] > 1:
            os.environ.update(LOCAL_RANK=str(rank), NODE_RANK="0")
            _as_slurm_task(rank)
        config_path = request["config"]
        sys.argv = [train.__file__, config_path]
        dump_stacks_on_signal(Path(json.loads(Path(config_path).read_text())["out_dir"]))
        train.main(config_path)
    except BaseException:
        _report(*sys.exc_info())
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    _exit_as_the_interpreter_does(code)


def _lead(request: dict[str, Any]) -> None:
    """In the forked leader: a session of its own, the run's output to its log, then the ranks."""
    os.setsid()
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.chdir(request["cwd"])
    os.environ.update(request.get("env", {}))
    world_size = request["world_size"]
    if world_size > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world_size))
    ranks = []
    for rank in range(1, world_size):
        pid = os.fork()
        if pid == 0:
            _run_rank(request, rank)
        ranks.append(pid)
    try:
        if world_size > 1:
            os.environ.update(LOCAL_RANK="0", NODE_RANK="0")
            _as_slurm_task(0)
        sys.argv = [train.__file__, request["config"]]
        dump_stacks_on_signal(Path(json.loads(Path(request["config"]).read_text())["out_dir"]))
        train.main(request["config"])
        code = 0
    except BaseException:
        _report(*sys.exc_info())
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # The run has succeeded if every other rank has too. After a failure here, the other ranks get a
    # while to end (and report their own failure) before the harness ends the whole group.
    codes = _wait_for(ranks, None if code == 0 else RANKS_GRACE_S)
    _exit_as_the_interpreter_does(code or next((each for each in codes if each != 0), 0))


def _as_slurm_task(rank: int) -> None:
    """In a run whose environment is a SLURM job step's (``SLURM_NTASKS``): this rank's task ids, as ``srun`` sets
    them (Lightning then finds a ``SLURMEnvironment`` and launches nothing)."""
    if "SLURM_NTASKS" in os.environ:
        os.environ.update(SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank))


def _wait_for(pids: list[int], seconds: float | None) -> list[int]:
    """The exit codes of ``pids`` (``None`` for one still running after ``seconds``; no limit if ``None``)."""
    deadline = None if seconds is None else time.monotonic() + seconds
    codes: dict[int, int] = {}
    while len(codes) < len(pids) and (deadline is None or time.monotonic() < deadline):
        for pid in pids:
            if pid not in codes:
                done, status = os.waitpid(pid, 0 if deadline is None else os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        if deadline is not None and len(codes) < len(pids):
            time.sleep(0.05)  # polling the ranks' exits until the grace period ends
    return [codes.get(pid, 0) for pid in pids]


def serve() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _lead(request)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"exit": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__mp_main__":  # a loader worker started by spawn, or multiprocessing's forkserver, of a run
    from processes import dump_stacks_if_asked

    dump_stacks_if_asked()


if __name__ == "__main__":
    serve()
