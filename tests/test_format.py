"""The checkpoint format: one envelope, one parser, every earlier form still read, and ``inspect``
reading it without Lightning."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from lightning_resumable.errors import StateFormatError
from lightning_resumable.format.envelope import (
    Envelope,
    LoadersState,
    LoaderState,
    PartialAccumulation,
    StreamState,
    parse,
)
from lightning_resumable.format.state import DataState

STATE = DataState(
    seed=3, epoch=1, position=8, batches=2, dataset_size=20, shuffle=True, drop_last=False, batch_size=2,
    world_size=2, anchor_position=0, anchor_batches=0, stream_length=20,
)  # fmt: skip
LOADER = LoaderState(STATE, dataset={"level": 1})
LOADERS = LoadersState(seed=3, mode="max_size_cycle", loaders={"a": LOADER, "b": LoaderState(STATE)})
STREAM = StreamState(
    seed=3, epoch=1, batches=2, world_size=1, num_workers=0, global_position=False, finished=False, ranks=[{}]
)


@pytest.mark.parametrize(
    "envelope",
    [
        Envelope(LOADER),
        Envelope(LOADERS, partial_accumulation=PartialAccumulation(1, 3, 4)),
        Envelope(STREAM),
        Envelope(None, reason="written from an exception path"),
    ],
    ids=["loader", "loaders", "stream", "unresumable"],
)
def test_each_kind_round_trips_through_its_envelope(envelope: Envelope) -> None:
    raw = envelope.to_dict()
    assert raw["format"] == 1 and raw["kind"] == envelope.kind and raw["keys"] == 1
    assert parse(raw) == envelope


@pytest.mark.parametrize(
    ("unversioned", "expected"),
    [
        (LOADER.to_dict(), Envelope(LOADER)),
        (LOADERS.to_dict(), Envelope(LOADERS)),
        ({"stream": STREAM.to_dict()}, Envelope(STREAM)),
        ({"unresumable": "why"}, Envelope(None, reason="why")),
        (
            {**LOADER.to_dict(), "partial_accumulation": {"accumulated": 1, "window": 3, "batches": 4}},
            Envelope(LOADER, partial_accumulation=PartialAccumulation(1, 3, 4)),
        ),
    ],
    ids=["loader", "loaders", "stream", "unresumable", "partial-accumulation"],
)
def test_a_state_written_before_the_envelope_reads_as_the_same_values(unversioned: Any, expected: Envelope) -> None:
    assert parse(unversioned) == expected


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": 2}, "format 2 is not supported"),
        ({"format": True}, "format True is not supported"),
        ({"kind": "tape"}, "unknown kind of data state 'tape'"),
        ({"keys": 2}, "key derivation 2 is not supported"),
        ({"extra": 1}, r"unexpected keys \['extra'\]"),
        ({"state": None}, "must be a dict, got NoneType"),
        ({"partial_accumulation": {"accumulated": -1, "window": 3, "batches": 4}}, "non-negative ints"),
    ],
)
def test_a_malformed_envelope_is_refused_with_what_is_wrong(change: dict[str, Any], message: str) -> None:
    with pytest.raises(StateFormatError, match=message):
        parse({**Envelope(LOADER).to_dict(), **change})


@pytest.mark.parametrize("raw", [None, 0, [], "state", {1: 2}, {"anything": 1}])
def test_what_is_no_data_state_is_refused(raw: object) -> None:
    with pytest.raises(StateFormatError):
        parse(raw)


def test_reading_a_checkpoint_does_not_import_lightning() -> None:
    code = (
        "import sys, lightning_resumable.tools.cli;"
        " print(sorted(m for m in sys.modules if m.split('.')[0] == 'lightning'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_every_message_is_bounded_however_large_the_value_it_quotes() -> None:
    """A 10^6-entry next_batch was repr'd into a 7.9 MB message."""
    from lightning_resumable.errors import MESSAGE_LIMIT, StateFormatError

    message = str(StateFormatError("bad: " + "x" * 10**6))
    assert len(message) < MESSAGE_LIMIT + 50 and message.endswith("characters more)")
    assert str(StateFormatError("short")) == "short"
