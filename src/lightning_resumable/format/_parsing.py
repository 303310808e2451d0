"""The checks every parser of the checkpoint format shares: a dict with string keys, the keys a value
must and may have, a digest's form."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from lightning_resumable.errors import StateFormatError

__all__ = ["DIGEST_HEX", "Kind", "is_digest", "mapping_of", "require_keys"]

Kind = Literal["loader", "loaders", "stream", "mixture", "unresumable"]
"""The kinds of train input a checkpoint's state is of; each state class names its own."""

DIGEST_HEX = 16
"""Hex digits of a digest (`lightning_resumable.core.verification.digest_of`)."""


def mapping_of(raw: object, what: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise StateFormatError(f"{what} must be a dict, got {type(raw).__name__}")
    if not all(isinstance(key, str) for key in raw):
        wrong = [key for key in raw if not isinstance(key, str)]
        raise StateFormatError(f"{what} must have string keys, got {wrong!r:.200}")
    return raw


def require_keys(raw: Mapping[str, Any], required: set[str], optional: set[str], what: str) -> None:
    missing, unknown = required - set(raw), set(raw) - required - optional
    if missing or unknown:
        raise StateFormatError(f"{what}: missing keys {sorted(missing)}, unexpected keys {sorted(unknown)}")


def is_digest(value: object) -> bool:
    """A 16-digit hex digest (`lightning_resumable.core.verification.digest_of`)."""
    return isinstance(value, str) and len(value) == DIGEST_HEX and re.fullmatch(r"[0-9a-f]+", value) is not None
