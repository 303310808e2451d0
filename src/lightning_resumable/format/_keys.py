"""Every key the library derives from a run's seed, in one place: each with its domain, all versioned.

Promise: each function is a pure function of its integer arguments, the same on every platform, and
frozen for `DERIVATION_VERSION`. The order of an epoch, the standard samplers' draws, the per-sample
and per-step seeds all come from here, so a checkpoint's stream is fixed by its seed, epoch and
position *and* this version, which the checkpoint records (``keys`` in its envelope,
`lightning_resumable.format.envelope`). A new derivation is a new version with functions of its own, selected
by the version a checkpoint records; version 1's functions never change.

Construction: SplitMix64 (Steele et al.) turns structured integers into key material. A key of a
domain is ``mix(mix(seed) ^ domain)``, then each further part (epoch, batch, cycle...) xored in and
mixed; the domains keep the streams of different uses apart. Two derivations predate that pattern
and keep their own form: the epoch order's round keys and the batch sampler's epoch generator.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["DERIVATION_VERSION", "Domain", "check_version", "domain_key", "splitmix64"]

DERIVATION_VERSION = 1
READABLE_VERSIONS = (1,)
MASK32 = 0xFFFFFFFF
MASK64 = 0xFFFFFFFFFFFFFFFF


class Domain(IntEnum):
    """What a key is for; the values are ASCII tags (or odd constants), frozen with version 1."""

    SAMPLE = 0x5A4D504C45  # a sample's seed from (seed, epoch, position)
    STEP = 0x53544550  # "STEP": a training step's seed from (seed, epoch, batch)
    AFTER_STEP = 0x4146544552  # "AFTER": the generators' seed once a training step has ended
    CYCLE = 0x4359434C45  # "CYCLE": a restarted loader's stream within an epoch
    STREAM = 0x53545245414D  # "STREAM": one worker's stream on one rank
    DRAW = 0x44524157  # "DRAW": uniform draws of the standard samplers
    WEIGHT = 0x574549474854  # "WEIGHT": the weighted sampler's keys without replacement
    ROUND = 0x524F554E44  # "ROUND": a repeated permutation's rounds
    BATCH = 0x4241544348  # "BATCH": a batch sampler's epoch generator
    EXPLICIT_TORCH = 0x9E3779B97F4A7C15  # a sample's explicit torch generator
    EXPLICIT_NUMPY = 0xD1B54A32D192ED03  # a sample's explicit NumPy generator
    VALIDATION = 0x56414C4944  # "VALID": a validation sample's seed from (seed, loader, index)
    HELD = 0x48454C44  # "HELD": a generator a dataset holds, from (sample seed, its path)
    MIXTURE = 0x4D4958  # "MIX": a mixture source's pass order, from (seed, the source's name, pass)
    CHUNKS = 0x4348554E4B  # "CHUNK": a chunked source's pass order, from (seed, the source's name, pass, level)
    WINDOW = 0x57494E444F57  # "WINDOW": a shuffled stream's window order and reads, from (its key, window, place)


def check_version(version: object) -> int:
    """``version`` if this release derives keys that way (a checkpoint's ``keys``), else ``ValueError``."""
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise ValueError(f"key derivation {version!r} is not supported (this release derives {READABLE_VERSIONS})")
    return version


def splitmix64(value: int) -> int:
    """One step of SplitMix64: a bijection of 64-bit integers that mixes every input bit into every output bit."""
    value = (value + 0x9E3779B97F4A7C15) & MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & MASK64
    return value ^ (value >> 31)


def domain_key(seed: int, domain: int, *parts: int) -> int:
    """The 64-bit key of ``domain`` for ``seed``, with each of ``parts`` (epoch, batch...) mixed in, in order."""
    key = splitmix64(splitmix64(seed & MASK64) ^ domain)
    for part in parts:
        key = splitmix64(key ^ part)
    return key


def step_seed(seed: int, epoch: int, batch: int) -> int:
    """The seed a training step starts from (below 2**63)."""
    return domain_key(seed, Domain.STEP, epoch, batch) >> 1


def after_step_seed(seed: int, epoch: int, batch: int) -> int:
    """The seed the generators hold once a training step has ended (below 2**63)."""
    return domain_key(seed, Domain.AFTER_STEP, epoch, batch) >> 1


def validation_sample_seed(seed: int, loader: int, index: int) -> int:
    """The seed of sample ``index`` of validation loader ``loader`` (below 2**63), the same at every validation."""
    return domain_key(seed, Domain.VALIDATION, loader, index) >> 1


def cycle_seed(seed: int, cycle: int) -> int:
    """The seed of a loader's ``cycle``-th restart within an epoch (below 2**63); cycle 0 is ``seed``."""
    return domain_key(seed, Domain.CYCLE, cycle) >> 1


def stream_key(seed: int, epoch: int, rank: int, worker: int) -> int:
    """The key of one worker's stream on one rank in one epoch."""
    return domain_key(seed, Domain.STREAM, epoch, rank << 16 | worker)


def stream_sample_seed(key: int, count: int) -> int:
    """The seed of the ``count``-th sample of a worker's stream (below 2**63)."""
    return splitmix64(key ^ count) >> 1


def explicit_generator_seed(sample_seed: int, domain: Domain) -> int:
    """The seed of a sample's explicit torch or NumPy generator (`lightning_resumable.sample_rng`)."""
    return splitmix64(sample_seed ^ domain)


def held_generator_seed(sample_seed: int, path_key: int) -> int:
    """The 64-bit seed of a generator a dataset holds, for one sample (``path_key``: where it sits)."""
    return splitmix64(splitmix64(sample_seed ^ Domain.HELD) ^ path_key)


def loader_seed(seed: int, key_digest: int) -> int:
    """The seed of the train loader under a key (its 64-bit digest), among several (below 2**63)."""
    return splitmix64(splitmix64(seed & MASK64) ^ key_digest) >> 1


def epoch_order_round_keys(seed: int, epoch: int, rounds: int) -> list[int]:
    """The 32-bit round keys of an epoch's Feistel order (its own form, predating `domain_key`)."""
    material = splitmix64(splitmix64(seed & MASK64) ^ epoch)
    return [splitmix64(material + round_index) & MASK32 for round_index in range(rounds)]


def repeated_round_seed(seed: int, round_index: int) -> int:
    """The seed of round ``round_index`` of a repeated permutation (more samples than the dataset)."""
    return splitmix64((seed ^ Domain.ROUND) + round_index)


def batch_epoch_seed(seed: int, epoch: int) -> int:
    """The seed of a batch sampler's generator for ``epoch`` (its own form: the seed is not pre-mixed)."""
    return splitmix64(splitmix64(seed ^ Domain.BATCH) ^ epoch) >> 1


def chunked_pass_seed(seed: int, source_key: int, pass_index: int, level: int) -> int:
    """The seed of one level of a chunked source's pass order: ``level`` 0 permutes the chunks, ``1 + k``
    the samples of window ``k`` (every part of the tuple mixed in, so no two (pass, window) pairs collide)."""
    return domain_key(seed, Domain.CHUNKS, source_key, pass_index, level) >> 1


def mixture_pass_seed(seed: int, source_key: int, pass_index: int) -> int:
    """The seed of pass ``pass_index`` over a mixture's source (``source_key``: its name's 64-bit digest)."""
    return domain_key(seed, Domain.MIXTURE, source_key, pass_index) >> 1
