"""Key derivation in one module: SplitMix64 as published, distinct domains, a version, and no other
module deriving keys by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

import lightning_resumable
from lightning_resumable.format._keys import MASK64, Domain, check_version, domain_key, splitmix64


def test_splitmix64_gives_the_reference_implementations_outputs() -> None:
    """Vigna's splitmix64.c from state 1234567: each output mixes the state after one more increment."""
    golden = 0x9E3779B97F4A7C15
    outputs = [splitmix64((1234567 + n * golden) & MASK64) for n in range(5)]
    assert outputs == [
        6457827717110365317,
        3203168211198807973,
        9817491932198370423,
        4593380528125082431,
        16408922859458223821,
    ]


def test_each_domain_keys_its_own_stream() -> None:
    assert len({int(domain) for domain in Domain}) == len(Domain)
    keys = {domain_key(7, domain, 0) for domain in Domain}
    assert len(keys) == len(Domain)
    assert domain_key(7, Domain.STEP, 1, 2) == splitmix64(domain_key(7, Domain.STEP, 1) ^ 2)


def test_only_the_derivation_this_release_writes_is_selected() -> None:
    assert check_version(1) == 1
    with pytest.raises(ValueError, match="key derivation 2 is not supported"):
        check_version(2)


def test_no_other_module_derives_keys_by_hand() -> None:
    package = Path(lightning_resumable.__file__).parent
    for module in package.glob("*.py"):
        if module.name != "_keys.py":
            text = module.read_text()
            assert "0x9E3779B97F4A7C15" not in text and "def _splitmix64" not in text, module.name
