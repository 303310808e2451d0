"""Process trees that cannot outlive a test: each launch is a session of its own; on a timeout every
process in it dumps its Python stack, then the whole group is killed.

A training run is rank 0, the ranks it launches, and each rank's loader workers. Killing rank 0
alone leaves the others running, orphaned (and a hung worker keeps its rank waiting forever), so
every launch gets its own process group and every end of a launch kills that group.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

STACK_SIGNAL = signal.SIGUSR2
"""The signal on which a process of a run writes every thread's Python stack (``faulthandler``).
Not SIGUSR1: Lightning's SLURM auto-requeue takes that one."""
STACKS_GLOB = "stacks.pid*.txt"


_registered_in: list[Path] = []
"""Where this process writes its stack (set once: a forked child writes a file of its own)."""


def dump_stacks_on_signal(directory: Path) -> None:
    """Called by each launched Python process at start: write every thread's stack to
    ``directory/stacks.pid{PID}.txt`` on `STACK_SIGNAL`. A forked loader worker writes a file of its
    own: dumps into one shared file interleave, and a stack cut into pieces says nothing."""
    stacks = (directory / f"stacks.pid{os.getpid()}.txt").open("w")
    faulthandler.register(STACK_SIGNAL, file=stacks, all_threads=True, chain=False)
    if not _registered_in:
        os.register_at_fork(after_in_child=lambda: dump_stacks_on_signal(_registered_in[-1]))
    _registered_in.append(directory)
    os.environ[_STACKS_VARIABLE] = str(directory)  # for a process started without a fork (`dump_stacks_if_asked`)


_STACKS_VARIABLE = "E2E_STACKS_DIR"


def dump_stacks_if_asked() -> None:
    """In a process a run started without forking (a loader worker started by spawn, multiprocessing's
    forkserver), as the run's main module is imported there: write its stack as the run's processes do."""
    directory = os.environ.get(_STACKS_VARIABLE)
    if directory and not _registered_in:
        dump_stacks_on_signal(Path(directory))


def launch(
    command: Sequence[str], log_path: Path, cwd: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``command`` in a session (and process group) of its own, its output to ``log_path``.

    Output goes to a file, not a pipe: orphaned loader workers would hold a pipe open.
    """
    with log_path.open("wb") as log:
        return subprocess.Popen(
            list(command),
            cwd=cwd,
            env=dict(env) if env is not None else None,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _proc_files(name: str) -> list[Path]:
    """``/proc/PID/name`` of every process now: listed by name, not globbed (pathlib's glob checks each path it
    builds exists, and one of a process that ends meanwhile raised ``ProcessLookupError`` out of the glob itself)."""
    return [Path("/proc", pid, name) for pid in os.listdir("/proc") if pid.isdigit()]


def living_members(group: int) -> list[int]:
    """The processes of process group ``group`` that are alive (not zombies), from ``/proc``."""
    members = []
    for stat in _proc_files("stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (command)": state, ppid, pgrp...
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def kill_tree(process: subprocess.Popen[bytes], settle_s: float = 10.0) -> None:
    """SIGKILL every process left in the launch's group (ranks, workers, orphans), reap the launch, and
    return once none of them runs any more (a SIGKILL is delivered asynchronously; on a busy machine a
    process may still run for a moment after ``killpg`` returns)."""
    with contextlib.suppress(ProcessLookupError):  # the whole group has exited
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + settle_s
    while (left := living_members(process.pid)) and time.monotonic() < deadline:
        time.sleep(0.01)  # polling /proc until the kernel has ended them, not waiting out a race
    assert not left, f"processes {left} of the killed tree still run {settle_s:.0f} s after SIGKILL"


def _stacks(directory: Path) -> str:
    parts = []
    for path in sorted(directory.glob(STACKS_GLOB)):
        text = path.read_text(errors="replace").strip()
        if text:
            parts.append(f"--- process {path.stem.removeprefix('stacks.pid')} ---\n{text}")
    return "\n".join(parts) or "(no process wrote a stack)"


def _wait_for_stacks(directory: Path, processes: int, seconds: float = 5.0) -> None:
    """Wait (at most ``seconds``) until ``processes`` processes have written their stacks: each dump,
    written from its process's signal handler when the kernel next runs it, names one current thread."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        written = sum(path.read_text(errors="replace").count("Current thread") for path in directory.glob(STACKS_GLOB))
        if written >= processes:
            return
        time.sleep(0.05)  # polling files being written, until a known count of dumps is there


def native_stacks(pids: list[int], seconds: float = 20.0) -> str:
    """Each process's native (C) stack with its Python frames, by ``py-spy dump --native`` (the test extra
    installs it), else ``gdb``; what neither can give is said. A loader worker that deadlocked in
    ``fork()`` before Python's after-fork hooks ran (CPython gh-112275 on 3.11.7) shows only here."""
    parts = []
    for pid in pids:
        py_spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"  # the venv's, unactivated
        for command in (
            [py_spy, "dump", "--native", "--pid", str(pid)],
            ["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt"],
        ):
            if shutil.which(command[0]) is None:
                continue  # not installed
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=seconds, check=False)
            except subprocess.TimeoutExpired:
                continue
            if done.returncode == 0 and done.stdout.strip():
                parts.append(f"--- process {pid} ({Path(command[0]).name}) ---\n{done.stdout.strip()}")
                break
        else:
            parts.append(f"--- process {pid}: no native stack (py-spy and gdb missing or refused) ---")
    return "\n".join(parts)


def wait_tree(process: subprocess.Popen[bytes], timeout: float, what: str, stacks_dir: Path, log_path: Path) -> int:
    """Wait for a launch; then kill whatever is left of its group.

    Raises:
        AssertionError: the launch ran past ``timeout``. Every process of the group has written its
            Python stack first; the message holds them and the log's tail.
    """
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        members = living_members(process.pid)
        # First: a process stuck before Python's after-fork hooks writes no Python stack. Kept in a file too,
        # since a test runner may cut the message short.
        native = native_stacks(members)
        native_path = stacks_dir / "native-stacks.txt"
        native_path.write_text(native)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, STACK_SIGNAL)
        _wait_for_stacks(stacks_dir, len(members))
        kill_tree(process)
        log = log_path.read_text(errors="replace")[-3000:] if log_path.exists() else ""
        raise AssertionError(
            f"{what} hung for {timeout:.0f} s; its whole process tree was killed. Each process's Python stack:\n"
            f"{_stacks(stacks_dir)}\n--- native stacks ---\n(also in {native_path})\n{native}\n--- log tail ---\n{log}"
        ) from None
    finally:
        kill_tree(process)


def members_with(group: int, token: str) -> list[int]:
    """The living processes of a launch: its first process, its process group's (the first makes the group),
    and (for a launcher that starts ranks in sessions of their own, as torchrun does) every process whose
    environment holds ``token``."""
    members = set(living_members(group))
    leader = Path(f"/proc/{group}/stat")  # the group's first process, before it has made the group its own
    with contextlib.suppress(FileNotFoundError, ProcessLookupError, IndexError):
        if leader.read_text().rsplit(")", 1)[1].split()[0] != "Z":
            members.add(group)
    needle = token.encode()
    for environ in _proc_files("environ"):
        try:
            if needle in environ.read_bytes():
                stat = (environ.parent / "stat").read_text().rsplit(")", 1)[1].split()
                if stat[0] != "Z":
                    members.add(int(environ.parent.name))
        except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
            continue
    return sorted(members)


def wait_gone(
    group: int, token: str, deadline: Callable[[], float], what: str, stacks_dir: Path, log_path: Path
) -> float:
    """Wait until every process of a launch (`members_with`) has ended; the moment it had, by
    ``time.monotonic()`` (comparable across processes). Past ``deadline()`` (a ``time.monotonic()`` moment,
    asked again at each look) each one's stacks are written and all are killed, as `wait_tree` does.

    Raises:
        AssertionError: a process of the launch still ran after the deadline.
    """
    started = time.monotonic()
    while members := members_with(group, token):
        if time.monotonic() >= deadline():
            timeout = time.monotonic() - started
            native = native_stacks(members)
            (stacks_dir / "native-stacks.txt").write_text(native)
            for pid in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, STACK_SIGNAL)
            _wait_for_stacks(stacks_dir, len(members))
            for pid in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            log = log_path.read_text(errors="replace")[-3000:] if log_path.exists() else ""
            raise AssertionError(
                f"{what}: processes {members} still ran {timeout:.0f} s on; they were killed. Each one's Python"
                f" stack:\n{_stacks(stacks_dir)}\n--- native stacks ---\n{native}\n--- log tail ---\n{log}"
            )
        time.sleep(0.01)  # polling /proc until the processes have ended
    return time.monotonic()


def run_tree(
    command: Sequence[str],
    log_path: Path,
    cwd: Path,
    timeout: float,
    what: str,
    env: Mapping[str, str] | None = None,
) -> int:
    """`launch` and `wait_tree`: the exit code of a launch that ended within ``timeout``."""
    return wait_tree(launch(command, log_path, cwd, env), timeout, what, cwd, log_path)


class _Leader:
    """A launch made by the fork server: what `wait_tree` and `kill_tree` need of a ``Popen``."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server, self.pid = server, pid
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.server.exit_code(timeout)
        return self.returncode

    def poll(self) -> int | None:
        """The exit code if the run has ended, else ``None`` (as ``Popen.poll``)."""
        try:
            return self.wait(timeout=0)
        except subprocess.TimeoutExpired:
            return None


class ForkServer:
    """Launches ``train.py`` runs from a process that has imported torch, Lightning and the library once
    (``forkserver.py``). Each run is still a fresh process tree in a session of its own, killed whole
    on a timeout, with every process's stack in the failure message; it only skips the imports."""

    SCRIPT = Path(__file__).with_name("forkserver.py")

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def _started(self) -> subprocess.Popen[bytes]:
        if self.process is None or self.process.poll() is not None:
            with self.log_path.open("ab") as log:
                self.process = subprocess.Popen(
                    [sys.executable, str(self.SCRIPT)],
                    cwd=self.SCRIPT.parent,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    start_new_session=True,
                )
        return self.process

    def _answer(self, timeout: float | None) -> dict[str, Any]:
        process = self._started()
        assert process.stdout is not None
        if timeout is not None:
            # poll, not select: a test process may hold more than 1024 descriptors (MosaicML Streaming keeps
            # shared memory open per dataset), and select() refuses a descriptor past 1023
            waiting = select.poll()
            waiting.register(process.stdout, select.POLLIN)
            if not waiting.poll(timeout * 1000):
                raise subprocess.TimeoutExpired("fork server", timeout)
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"the fork server ended; its log: {self.log_path}\n{self.log_path.read_text()[-3000:]}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def exit_code(self, timeout: float | None) -> int:
        return int(self._answer(timeout)["exit"])

    def launch(
        self, config_path: Path, world_size: int, log_path: Path, cwd: Path, env: Mapping[str, str] | None = None
    ) -> _Leader:
        process = self._started()
        assert process.stdin is not None
        request = {"config": str(config_path), "world_size": world_size, "log": str(log_path), "cwd": str(cwd)}
        request["env"] = dict(env or {})
        process.stdin.write((json.dumps(request) + "\n").encode())
        process.stdin.flush()
        return _Leader(self, int(self._answer(60)["pid"]))

    def run(
        self,
        config_path: Path,
        world_size: int,
        log_path: Path,
        cwd: Path,
        timeout: float,
        what: str,
        env: Mapping[str, str] | None = None,
    ) -> int:
        """`launch` and `wait_tree`: the exit code of a run that ended within ``timeout``."""
        leader = self.launch(config_path, world_size, log_path, cwd, env)
        return wait_tree(leader, timeout, what, cwd, log_path)  # type: ignore[arg-type]

    def close(self) -> None:
        if self.process is not None:
            kill_tree(self.process)
            self.process = None


def free_port() -> int:
    """A TCP port no process listens on now, for a run's rendezvous (``MASTER_PORT``), drawn below the kernel's
    ephemeral range: every outgoing connection on the machine takes its port from that range, and one probed free
    there (``bind`` to port 0) was taken by another test process's connection before rank 0 listened on it
    (``EADDRINUSE``; its other rank waited for it until the test's timeout: CI under ``-n 2``)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    draw = random.SystemRandom()
    for _ in range(200):
        port = draw.randrange(max(1024, low - 12000), low)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:  # in use: draw another
                continue
            return port
    raise RuntimeError(f"no free TCP port below the ephemeral range ({low}) in 200 draws")
