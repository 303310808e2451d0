"""What holding the preemption signals costs a training step: one all-reduce of a flag per signal.

``python benchmarks/signal_agreement.py [CALLS]`` starts 2 processes (gloo, CPU, as the tests) and
times, on rank 0, ``DeferredSignals.agree`` (the callback calls it once per training batch under DDP)
against the broadcast Lightning itself does at every step to share rank 0's SIGTERM flag, and the
all-reduce of a small model's gradients, which every DDP step pays anyway. Prints a table.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lightning_resumable.lightning.signals import DeferredSignals

WORLD_SIZE = 2


def per_call_us(function: object, calls: int) -> float:
    assert callable(function)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        function()
    dist.barrier()
    return (time.perf_counter() - start) / calls * 1e6


def run(rank: int, port: int, calls: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    torch.set_num_threads(1)
    signals = DeferredSignals([signal.SIGTERM, signal.SIGUSR1])
    cpu = torch.device("cpu")
    rows = [("agree (2 signals)", per_call_us(lambda: signals.agree(cpu), calls))]
    flag = torch.tensor([0])  # Lightning's own per-step SIGTERM broadcast (_broadcast_sigterm_tensor)
    lightnings = per_call_us(lambda: (dist.broadcast(flag, 0), flag.item()), calls)
    rows.append(("Lightning's SIGTERM broadcast + item()", lightnings))
    for parameters in (10_000, 1_000_000):
        gradient = torch.zeros(parameters)
        micros = per_call_us(lambda gradient=gradient: dist.all_reduce(gradient), calls)
        rows.append((f"gradient all-reduce, {parameters:,} floats", micros))
    if rank == 0:
        agree = rows[0][1]
        print(f"| operation ({WORLD_SIZE} processes, gloo, {calls} calls) | µs per call | agree / this |")
        print("|---|---:|---:|")
        for name, micros in rows:
            print(f"| {name} | {micros:.0f} | {agree / micros:.2f} |")
    dist.destroy_process_group()


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.spawn(run, args=(port, calls), nprocs=WORLD_SIZE)


if __name__ == "__main__":
    main()
