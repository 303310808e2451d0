"""Imported by multiprocessing's forkserver as it starts, when a rank holding preemption signals started it
(`lightning_resumable.readers.worker_starts`): the server, started with those signals blocked, leaves them
to the rank from here on, and so does every process it forks (until a loader worker's own loop takes over).
Importing it anywhere else does nothing."""

from __future__ import annotations

import os
import signal

from lightning_resumable.readers.worker_signals import LeftToHolder, forked_by_server, map_record

# worker_starts.HOLDER_VARIABLE, repeated: the server imports only what it needs.
_VARIABLE = "LIGHTNING_RESUMABLE_SIGNAL_HOLDER"


def _leave_signals_to_the_rank() -> None:
    holder = os.environ.pop(_VARIABLE, "")
    if not holder:
        return
    rank, _, held = holder.partition(":")
    path, _, listed = held.rpartition(":")
    signums = tuple(int(signum) for signum in listed.split(",") if signum)
    record = map_record(path)
    LeftToHolder(record, int(rank), signums).install()  # the server's parent is the rank (its pid, not getppid())
    server = os.getpid()

    def in_forked_child() -> None:  # a process the server forks: its parent is the server, which ends with the rank
        LeftToHolder(record, server, signums).install()
        forked_by_server(server)

    os.register_at_fork(after_in_child=in_forked_child)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, signums)


_leave_signals_to_the_rank()
