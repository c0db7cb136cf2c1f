"""The value types of :mod:`kvlab.tiers`: tier specs, lookup results, checked keys."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

#: Write policies of :class:`~kvlab.tiers.store.TieredStore`.
WRITE_POLICIES = ("write_through", "write_back", "write_through_selective")
#: Lookup walks of :class:`~kvlab.tiers.store.TieredStore`.
WALKS = ("per_block", "opal")


def check_keys(keys: object) -> tuple[int, ...]:
    """Block keys as a tuple of u64 ints (``ValueError`` naming the bad one)."""
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Iterable):
        raise ValueError(f"keys must be a sequence of block keys (integers in [0, 2**64)), got {keys!r}")
    keys = tuple(keys)
    for i, key in enumerate(keys):
        if isinstance(key, bool) or not isinstance(key, (int, np.integer)) or not 0 <= key < 2**64:
            raise ValueError(f"keys[{i}] must be an integer in [0, 2**64), got {key!r}")
    return tuple(int(k) for k in keys)


@dataclass(frozen=True)
class TierSpec:
    """One tier's configuration: ``name`` (the KV events' ``medium``), ``capacity_blocks``
    (``None`` = unbounded) and ``policy`` (a :mod:`kvlab.policies` name, or ``None`` for
    no eviction).

    Example:
        >>> TierSpec("CPU", 8_000, "s3fifo").policy
        's3fifo'
    """

    name: str
    capacity_blocks: int | None
    policy: str | None = "lru"


def tier_specs(tiers: object) -> list[TierSpec]:
    """``tiers`` as :class:`TierSpec` objects (``(name, capacity_blocks[, policy])`` tuples
    accepted).

    Raises:
        ValueError: not a list of tiers, or an item that is neither a TierSpec nor a 2- or
            3-tuple.
    """
    if isinstance(tiers, (str, bytes, TierSpec, Mapping)) or not isinstance(tiers, Iterable):
        raise ValueError(f"tiers must be a list of TierSpec or (name, capacity_blocks[, policy]) tuples, got {tiers!r}")
    specs = []
    for i, t in enumerate(tiers):
        if isinstance(t, TierSpec):
            specs.append(t)
        elif isinstance(t, (tuple, list)) and len(t) in (2, 3):
            specs.append(TierSpec(*t))
        else:
            raise ValueError(f"tiers[{i}] must be a TierSpec or a (name, capacity_blocks[, policy]) tuple, got {t!r}")
    return specs


@dataclass(frozen=True)
class LookupResult:
    """The combined prefix a lookup found: ``hit_blocks`` and the index of the tier that
    holds each of them (``tiers``, length ``hit_blocks``)."""

    hit_blocks: int
    tiers: tuple[int, ...]

    def blocks_per_tier(self, n_tiers: int) -> list[int]:
        """Hit blocks served by each tier, in tier order."""
        counts = [0] * n_tiers
        for t in self.tiers:
            counts[t] += 1
        return counts
