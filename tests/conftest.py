"""Which ``lightning_resumable`` the tests run against; CI requires the installed wheel."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import lightning_resumable

SOURCE_TREE = Path(__file__).resolve().parents[1] / "src"


def pytest_report_header() -> str:
    return f"lightning_resumable {lightning_resumable.__version__} from {Path(lightning_resumable.__file__).parent}"


def pytest_configure() -> None:
    # .ci/run installs the built wheel and sets this, so the suite cannot pass on the source tree by accident.
    if (
        os.environ.get("LIGHTNING_RESUMABLE_REQUIRE_INSTALLED")
        and SOURCE_TREE in Path(lightning_resumable.__file__).parents
    ):
        raise pytest.UsageError(f"the tests must run against the installed wheel, not {lightning_resumable.__file__}")
