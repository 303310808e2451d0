"""torch's private ``DataLoader`` names that `lightning_resumable.internals._torch` uses, against the
installed torch."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

from lightning_resumable.internals._torch import (
    MakesIterators,
    batches_handed_out,
    has_shut_down,
    iterator_factory,
    next_batch_function,
    replace_next_batch,
    retire_iterator,
    set_iterator_factory,
    uses_worker_processes,
)

DATA = list(range(12))


def test_every_iterator_is_made_through_the_factory() -> None:
    loader = DataLoader(DATA, batch_size=4)
    made: list[Any] = []
    make = iterator_factory(loader)
    set_iterator_factory(loader, lambda: made.append(make()) or made[-1])
    iterator = iter(loader)
    assert made == [iterator]
    assert [batch.tolist() for batch in iterator] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert type(loader) is DataLoader


def test_a_loader_class_with_the_mixin_makes_its_iterators_through_make_iterator() -> None:
    class Counting(MakesIterators, DataLoader[Any]):
        made = 0

        def make_iterator(self, make: Any) -> Any:
            Counting.made += 1
            return make()

    loader = Counting(DATA, batch_size=6, num_workers=0)
    for _ in range(2):
        assert len(list(loader)) == 2
    assert Counting.made == 2


def test_each_batch_is_read_through_the_replaced_function_and_counted() -> None:
    iterator = iter(DataLoader(DATA, batch_size=4))
    read = next_batch_function(iterator)
    assert read is not None
    seen: list[int] = []

    def reading() -> Any:
        seen.append(batches_handed_out(iterator))
        return read(iterator)

    replace_next_batch(iterator, reading)
    assert len(list(iterator)) == 3
    assert seen == [0, 1, 2, 3] and batches_handed_out(iterator) == 3, "the fourth read ended the pass"
    assert next_batch_function(iter([1, 2])) is None, "not torch's iterator"


def test_a_worker_iterator_is_retired_with_its_processes_and_feeder_threads() -> None:
    loader = DataLoader(DATA, batch_size=2, num_workers=2, multiprocessing_context="fork")
    iterator = iter(loader)
    assert uses_worker_processes(iterator) and not uses_worker_processes(iter(DataLoader(DATA)))
    next(iterator)
    assert not has_shut_down(iterator)
    workers, queues = list(iterator._workers), list(iterator._index_queues)  # type: ignore[attr-defined]
    assert workers and all(worker.is_alive() for worker in workers)
    assert all(queue._thread is not None for queue in queues), "feeder threads started by the first indices"
    retire_iterator(iterator, timeout=30.0)
    assert has_shut_down(iterator)
    assert not any(worker.is_alive() for worker in workers)
    assert not any(queue._thread.is_alive() for queue in queues)
    retire_iterator(iterator, timeout=30.0)  # idempotent
    retire_iterator(iter(DataLoader(DATA)), timeout=30.0)  # a single-process one: nothing to do


def test_a_finished_pass_shuts_its_workers_down() -> None:
    iterator = iter(DataLoader(DATA, batch_size=6, num_workers=2, multiprocessing_context="fork"))
    assert [batch.shape for batch in iterator] == [torch.Size([6]), torch.Size([6])]
    assert has_shut_down(iterator)


def test_a_worker_loop_sets_torchs_signal_handlers_first_through_the_module_with_its_done_event() -> None:
    """What `after_worker_signal_setup` wraps: torch's and torchdata's worker loops take ``done_event`` and call
    ``signal_handling._set_worker_signal_handlers`` (looked up on the module) before anything else."""
    import inspect

    from torch.utils.data._utils import worker
    from torchdata.stateful_dataloader import worker as stateful_worker

    for module in (worker, stateful_worker):
        assert "done_event" in inspect.signature(module._worker_loop).parameters
        source = inspect.getsource(module._worker_loop)
        body = source[source.index("try:") :]
        first_call = next(
            line.strip() for line in body.splitlines()[1:] if line.strip() and not line.strip().startswith("#")
        )
        assert first_call == "signal_handling._set_worker_signal_handlers()", (module.__name__, first_call)


def test_an_event_is_read_without_its_lock() -> None:
    """From a signal handler that may interrupt the lock's holder: set or not, and no wait while it is held."""
    import multiprocessing

    from lightning_resumable.internals._torch import is_set_without_locking

    event = multiprocessing.get_context("fork").Event()
    with event._cond:  # type: ignore[attr-defined]  # held, as by the interrupted is_set()
        assert not is_set_without_locking(event)
    event.set()
    with event._cond:  # type: ignore[attr-defined]
        assert is_set_without_locking(event)


class _Uneven(torch.utils.data.IterableDataset[int]):
    """Worker ``w`` yields ``SAMPLES[w]`` samples, numbered ``100 * w`` on."""

    SAMPLES = (5, 2, 7)

    def __iter__(self) -> Any:
        worker = torch.utils.data.get_worker_info()
        assert worker is not None
        return iter(range(100 * worker.id, 100 * worker.id + self.SAMPLES[worker.id]))


def test_workers_take_turns_and_one_that_runs_out_is_passed_over_whatever_the_prefetch() -> None:
    """What issue 55's one stream order for every layout stands on (docs/development.md): a loader's epoch is its
    workers' batches in turn, each worker's last batch partial, a worker that has run out passed over, so the
    order is a function of what each worker holds, not of timing (``prefetch_factor``)."""
    batch_size, left = 2, [list(range(100 * w, 100 * w + n)) for w, n in enumerate(_Uneven.SAMPLES)]
    expected, turn = [], 0
    while any(left):
        worker = turn % len(left)
        if left[worker]:
            expected.append(left[worker][:batch_size])
            left[worker] = left[worker][batch_size:]
        turn += 1
    for prefetch in (1, 3):
        loader = DataLoader(_Uneven(), batch_size=batch_size, num_workers=3, prefetch_factor=prefetch)
        assert [batch.tolist() for batch in loader] == expected, prefetch


def test_a_stream_read_as_another_worker_sees_that_workers_info_while_it_reads_and_its_own_after() -> None:
    """`read_as_worker` (a stream resumed on another layout reads another layout's worker's share): torch's
    ``get_worker_info()`` answers from ``_utils.worker._worker_info``, a ``WorkerInfo`` of ``id`` and ``num_workers``,
    whatever the reading process is."""
    from torch.utils.data import get_worker_info

    from lightning_resumable.internals._torch import read_as_worker

    def seen() -> Any:
        while True:
            info = get_worker_info()
            yield None if info is None else (info.id, info.num_workers)

    assert list(zip(range(2), read_as_worker(seen(), 2, 3, None), strict=False)) == [(0, (2, 3)), (1, (2, 3))]
    assert next(read_as_worker(seen(), None, 0, None)) is None
    assert get_worker_info() is None, "the process's own answer again"
