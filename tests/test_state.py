"""The persisted state refuses malformed input and incompatible setups with specific errors."""

from __future__ import annotations

from typing import Any

import pytest

from lightning_resumable import DataState, IncompatibleStateError, StateFormatError


def valid() -> dict[str, Any]:
    return DataState(
        seed=1,
        epoch=2,
        position=40,
        batches=5,
        dataset_size=100,
        shuffle=True,
        drop_last=False,
        batch_size=4,
        world_size=2,
        anchor_position=0,
        anchor_batches=0,
        stream_length=100,
    ).to_dict()


def test_round_trip_keeps_every_value() -> None:
    assert DataState.from_dict(valid()).to_dict() == valid()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"version": 99}, "version 99 is not supported"),
        ({"version": True}, "version True is not supported"),  # True == 1 once read as version 1
        ({"version": 1.0}, "version 1.0 is not supported"),
        ({"version": 2.0}, "version 2.0 is not supported"),
        ({"epoch": "2"}, "'epoch' must be int"),
        ({"shuffle": 1}, "'shuffle' must be bool"),
        ({"position": -1}, "negative"),
        ({"batch_size": 0}, "non-positive"),
        ({"drop_last_batch": None}, "'drop_last_batch' must be bool"),  # a version that records it
        ({"anchor_position": None, "anchor_batches": None}, "'anchor_position' must be int"),
        ({"anchor_position": 0, "anchor_batches": 6}, "anchor .* lies after its position"),
        ({"anchor_position": 0, "anchor_batches": 0, "position": 48}, r"position 48 is not where 5 batches .*\(40"),
        ({"anchor_position": 0, "anchor_batches": 0, "position": 41}, r"position 41 is not where"),
        ({"anchor_position": 0, "anchor_batches": 0, "position": 112, "batches": 14}, "past the end of its epoch"),
        ({"version": 4, "position": 108, "batches": 27}, "past the end of its epoch"),  # no anchor: the bound only
        ({"anchor_position": 0, "anchor_batches": "0"}, "'anchor_batches' must be int"),
        ({"stream_length": None}, "'stream_length' must be int"),
        ({"stream_length": 32}, "past the end of its epoch"),  # the recorded length bounds the position
        ({"stream_length": -1}, "negative"),
    ],
)
def test_malformed_state_is_refused(change: dict[str, Any], message: str) -> None:
    with pytest.raises(StateFormatError, match=message):
        DataState.from_dict({**valid(), **change})


def test_a_state_of_an_older_version_saved_again_keeps_that_versions_form() -> None:
    """Read from version 3 (no ``drop_last_batch``, no anchor) and saved before it was applied: written
    as version 3 again, not as version 5 with None, which the parser refuses."""
    gone = ("drop_last_batch", "anchor_position", "stream_length")
    old = {key: value for key, value in valid().items() if key not in gone}
    old = {**{key: value for key, value in old.items() if key != "anchor_batches"}, "version": 3}
    again = DataState.from_dict(old).to_dict()
    assert again == old
    assert DataState.from_dict(again) == DataState.from_dict(old)


def test_missing_key_is_named() -> None:
    raw = valid()
    del raw["seed"]
    with pytest.raises(StateFormatError, match="'seed'"):
        DataState.from_dict(raw)


def test_different_setup_names_every_difference() -> None:
    saved = DataState.from_dict(valid())
    current = DataState.from_dict({**valid(), "version": 4, "dataset_size": 99, "batch_size": 8, "world_size": 3})
    with pytest.raises(IncompatibleStateError, match="dataset_size: checkpoint 100, now 99; batch_size") as info:
        saved.check_same_data(current)
    assert "world_size" not in str(info.value)


def test_the_version_is_pyproject_tomls() -> None:
    """One place for the version: pyproject.toml; ``__version__`` reads it back from the installed metadata."""
    import tomllib
    from pathlib import Path

    import lightning_resumable

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert lightning_resumable.__version__ == pyproject["project"]["version"]


def test_the_position_is_checked_from_the_anchor() -> None:
    """One world size ran the epoch: ``batches`` of ``batch_size`` on ``world_size`` ranks. A resume on
    another world size moved the anchor to its restored place: the position counts on from there."""
    assert DataState.from_dict({**valid(), "anchor_position": 0, "anchor_batches": 0}).position == 40
    resized = {**valid(), "anchor_position": 36, "anchor_batches": 3, "position": 52, "batches": 5}
    assert DataState.from_dict(resized).position == 36 + 2 * 4 * 2
    padded = {**valid(), "anchor_position": 0, "anchor_batches": 0, "position": 104, "batches": 13}
    assert DataState.from_dict(padded).position == 104  # the last batch, padded on every rank


def test_a_version_4_state_reads_without_an_anchor() -> None:
    raw = {key: value for key, value in valid().items() if not key.startswith("anchor_")}
    state = DataState.from_dict({**raw, "version": 4})
    assert (state.anchor_position, state.anchor_batches, state.version) == (None, None, 6)
    with pytest.raises(StateFormatError, match="lacks the key 'anchor_position'"):
        DataState.from_dict({**raw, "version": 5})


def test_a_state_before_version_6_reads_its_length_from_its_draws_description() -> None:
    """Versions 1 to 5 did not record the stream's length: a permutation's is the dataset size, other
    draws name it; a batch sampler's stream is not bounded, and saved again it keeps version 5's form."""
    version_5 = {key: value for key, value in valid().items() if key != "stream_length"} | {"version": 5}
    assert DataState.from_dict(version_5).stream_length == 100
    weighted = version_5 | {"draws": "weighted-with-replacement(num_samples=60, digest=ab)"}
    assert DataState.from_dict(weighted).stream_length == 60
    batches = version_5 | {"draws": "batch-sampler(ByLength)", "position": 400, "batches": 50}
    state = DataState.from_dict(batches)
    assert state.stream_length is None and state.to_dict() == batches
    assert DataState.from_dict(version_5).to_dict() == valid()  # its length known: written as version 6
