from __future__ import annotations

import os
from pathlib import Path

import pytest

from .harness import Runner

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of this folder ``e2e``: ``-m "not e2e"`` runs the unit tests alone."""
    for item in items:
        if _HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Runner:
    """One runner for the whole session, so scenarios share uninterrupted and stopped runs: under pytest-xdist,
    one folder for every worker of the session (the workers' temporary folders' common parent)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "e2e-shared"
        shared.mkdir(exist_ok=True)
        return Runner(shared)
    return Runner(tmp_path_factory.mktemp("e2e"))
