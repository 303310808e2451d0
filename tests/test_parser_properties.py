"""The parser is total: any value in the library's slot of a checkpoint gives typed states that the
restore checks accept, or a `StateFormatError`/`IncompatibleStateError`; never another exception.

Properties over arbitrary values, and over mutations of real states of every kind: the release
checkpoints of 0.1.0 and 0.2.0 (one map-style loader, weighted draws, several loaders, a stream),
and this release's envelopes (a loader with fingerprints, a dataset state and an anchor, several
loaders, a stream with real torchdata states of 0 and 2 workers and their batch digests, an
unresumable state, a save inside an accumulation window). A mutation replaces any node with an
arbitrary value, deletes a key, adds one, or cuts a list short.
"""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_resumable.errors import IncompatibleStateError, StateFormatError
from lightning_resumable.format.envelope import (
    STATE_KEY,
    BatchFingerprint,
    Envelope,
    LoadersState,
    LoaderState,
    PartialAccumulation,
    StreamState,
    parse,
)
from lightning_resumable.format.state import DataState
from lightning_resumable.internals._torchdata import torchdata_version

from .helpers import loader_state, stream_loader

FIXTURES = Path(__file__).parent / "fixtures"
REFUSALS = (StateFormatError, IncompatibleStateError)

DATA = DataState(
    seed=3, epoch=1, position=8, batches=2, dataset_size=20, shuffle=True, drop_last=False, batch_size=2,
    world_size=2, anchor_position=0, anchor_batches=0, stream_length=20,
)  # fmt: skip
PRINTS = [BatchFingerprint("0123456789abcdef", "fedcba9876543210"), BatchFingerprint("0" * 16, "f" * 16)]


def this_releases_states() -> dict[str, dict[str, Any]]:
    stream = {
        workers: StreamState(
            seed=3, epoch=1, batches=2, world_size=2, num_workers=workers, global_position=False, finished=False,
            ranks=[loader_state(workers), loader_state(workers)], torchdata=torchdata_version(),
            next_batch=["0123456789abcdef", ""],
        )
        for workers in (0, 2)
    }  # fmt: skip
    loader = LoaderState(DATA, PRINTS, dataset={"level": 1})
    return {
        "loader": Envelope(loader).to_dict(),
        "loaders": Envelope(LoadersState(3, "max_size_cycle", {"a": loader, "b": LoaderState(DATA)})).to_dict(),
        "stream-0-workers": Envelope(stream[0]).to_dict(),
        "stream-2-workers": Envelope(stream[2]).to_dict(),
        "unresumable": Envelope(None, reason="written from an exception path").to_dict(),
        "partial": Envelope(loader, partial_accumulation=PartialAccumulation(1, 3, 4)).to_dict(),
    }


def release_states() -> dict[str, dict[str, Any]]:
    return {
        f"{release.name}-{checkpoint.stem}": torch.load(checkpoint, weights_only=True)["callbacks"][STATE_KEY]
        for release in sorted(FIXTURES.iterdir())
        for checkpoint in sorted(release.glob("*.ckpt"))
    }


REAL = {**release_states(), **this_releases_states()}


def resume_checks(raw: object) -> None:
    """Parse ``raw`` and run every check a restore makes before any loader is touched; what parses
    is written back as the same state (the checkpoint a resumed run writes before it trains)."""
    envelope = parse(raw)
    assert parse(envelope.to_dict()) == envelope
    body = envelope.state
    if isinstance(body, StreamState):
        # As if resumed with the torchdata that wrote it: a newer one's state is refused by an older
        # torchdata (unit-tested in test_streams.py); CI's oldest-versions step has torchdata 0.10.
        installed = body.torchdata or None
        reader = stream_loader(body.num_workers)
        for rank in range(body.world_size):
            reader.state_for_rank(body, rank, body.world_size, torchdata=installed)
    for loader in body.loaders.values() if isinstance(body, LoadersState) else [body]:
        if isinstance(loader, LoaderState):
            loader.state.check_same_data(loader.state)


def test_every_real_state_passes_the_checks_unchanged() -> None:
    assert len(REAL) == 16  # 0.1.0: 1 scenario; 0.2.0: 4; 0.3.0: 5 (a mixture among them); this tree's: 6
    for raw in REAL.values():
        resume_checks(raw)


VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8) | st.integers(), children),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(VALUES)
def test_an_arbitrary_value_is_parsed_or_refused(raw: object) -> None:
    with contextlib.suppress(*REFUSALS):
        resume_checks(raw)


def nodes(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The path of every node of a nested state, the root's included."""
    found = [path]
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    for key, child in children:
        found += nodes(child, (*path, key))
    return found


def mutated(raw: dict[str, Any], path: tuple[Any, ...], operation: str, value: object) -> object:
    result = copy.deepcopy(raw)
    if not path:
        return value
    parent = result
    for key in path[:-1]:
        parent = parent[key]
    node = parent[path[-1]]
    if operation == "delete" and isinstance(parent, dict):
        del parent[path[-1]]
    elif operation == "add key" and isinstance(node, dict):
        node["unexpected"] = value
    elif operation == "cut" and isinstance(node, list):
        del node[len(node) // 2 :]
    else:
        parent[path[-1]] = value
    return result


@pytest.mark.parametrize("name", sorted(REAL))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_a_mutated_real_state_is_parsed_or_refused(name: str, data: st.DataObject) -> None:
    raw = REAL[name]
    path = data.draw(st.sampled_from(nodes(raw)), label="path")
    operation = data.draw(st.sampled_from(["replace", "delete", "add key", "cut"]), label="operation")
    value = data.draw(VALUES, label="value")
    with contextlib.suppress(*REFUSALS):
        resume_checks(mutated(raw, path, operation, value))
