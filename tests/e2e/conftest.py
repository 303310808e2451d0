from __future__ import annotations

import pytest

from .harness import Runner


@pytest.fixture(scope="session")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Runner:
    """One runner for the whole session, so scenarios share uninterrupted and stopped runs."""
    return Runner(tmp_path_factory.mktemp("e2e"))
