"""multiprocessing's forkserver internals the library relies on: the one module that names them.

multiprocessing has no public way to read the forkserver's preload list (only to replace it), to ask
whether its server runs, or to start another without waiting for the first to end. The library adds a module
of its own to that list and starts the server itself while a rank holds preemption signals
(`lightning_resumable.readers.worker_starts`). Tested against the installed Python by
``tests/test_worker_starts.py``.
"""

from __future__ import annotations

import contextlib
import os
from multiprocessing import forkserver
from typing import Any

__all__ = ["abandon_forkserver", "forkserver_pid", "forkserver_preload", "start_forkserver"]

_abandoned: list[int] = []


def forkserver_preload() -> list[str]:
    """The modules the forkserver imports as it starts (``['__main__']`` unless set)."""
    modules: list[str] = list(forkserver._forkserver._preload_modules)  # type: ignore[attr-defined]
    return modules


def forkserver_pid() -> int | None:
    """The pid of this process's forkserver, ``None`` if it has not started one (or it was found dead)."""
    pid: int | None = forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
    return pid


def start_forkserver() -> int:
    """Start this process's forkserver now (``ensure_running``, public but undocumented); its pid."""
    forkserver.ensure_running()
    pid = forkserver_pid()
    assert pid is not None
    return pid


def abandon_forkserver() -> None:
    """Let this process's forkserver go without waiting for it (``_stop`` would wait until every process holding
    its pipe, a forked loader worker too, has closed it): the next `start_forkserver` starts another. It ends once
    no process holds that pipe; the processes it started go on. Reaps the servers abandoned before that ended."""
    server: Any = forkserver._forkserver
    with server._lock:
        if server._forkserver_pid is not None:
            os.close(server._forkserver_alive_fd)
            _abandoned.append(server._forkserver_pid)
            address = server._forkserver_address
            server._forkserver_alive_fd = server._forkserver_address = server._forkserver_pid = None
            if isinstance(address, str) and not address.startswith("\0"):  # a socket file, not an abstract name
                with contextlib.suppress(OSError):
                    os.unlink(address)
    for pid in list(_abandoned):
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == 0:
                continue
        _abandoned.remove(pid)
