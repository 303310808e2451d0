"""0.2.0's module paths of its public names import until 0.4.0, each with a `DeprecationWarning` that names the
import to write instead; its private helpers are gone."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

import lightning_resumable
from lightning_resumable._moved import MOVED
from lightning_resumable.format.envelope import StreamState


@pytest.mark.parametrize(("old", "name"), [(old, name) for old, names in MOVED.items() for name in names])
def test_a_name_at_its_020_path_is_the_same_object_with_a_warning_naming_its_new_import(old: str, name: str) -> None:
    module = importlib.import_module(f"lightning_resumable.{old}")
    warning = rf"lightning_resumable\.{old}\.{name} .* removed in 0\.4\.0: use `from "
    with pytest.warns(DeprecationWarning, match=warning):
        moved = getattr(module, name)
    expected = StreamState if name == "StreamState" else getattr(lightning_resumable, name)
    assert moved is expected


def test_the_020_import_statements_work_and_a_private_helper_is_refused() -> None:
    with pytest.warns(DeprecationWarning, match="use `from lightning_resumable import ResumableSampler`"):
        from lightning_resumable.sampler import ResumableSampler
    assert ResumableSampler is lightning_resumable.ResumableSampler
    with pytest.raises(ImportError, match="make_stream_resumable"):
        from lightning_resumable.streams import make_stream_resumable  # noqa: F401
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("lightning_resumable.no_such_module")


def test_the_020_paths_import_in_a_fresh_interpreter_with_warnings_as_errors_only_at_use() -> None:
    code = "import lightning_resumable.callback as c; import warnings; print(sorted(dir(c)))"
    shown = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "['ResumableDataCallback']"


def test_allow_inexact_streams_warns_that_it_has_no_effect() -> None:
    """The one stream it accepted, a Hugging Face stream with a shuffle buffer, resumes exactly since issue 46."""
    with pytest.warns(DeprecationWarning, match=r"allow_inexact_streams=.* no effect .* removed in 0\.4\.0"):
        lightning_resumable.ResumableDataCallback(allow_inexact_streams=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lightning_resumable.ResumableDataCallback()
