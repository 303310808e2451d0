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
    ],
)
def test_malformed_state_is_refused(change: dict[str, Any], message: str) -> None:
    with pytest.raises(StateFormatError, match=message):
        DataState.from_dict({**valid(), **change})


def test_missing_key_is_named() -> None:
    raw = valid()
    del raw["seed"]
    with pytest.raises(StateFormatError, match="'seed'"):
        DataState.from_dict(raw)


def test_different_setup_names_every_difference() -> None:
    saved = DataState.from_dict(valid())
    current = DataState.from_dict({**valid(), "dataset_size": 99, "batch_size": 8, "world_size": 3})
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
