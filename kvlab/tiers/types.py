"""The value types of :mod:`kvlab.tiers`: tier specs, a tiered configuration, lookup results."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kvlab.core.semantics import TOUCH_ORDERS
from kvlab.core.validate import check_choice, check_count, check_flag, check_positive, check_real, check_str, check_u64
from kvlab.policies import POLICIES

#: Write policies of :class:`~kvlab.tiers.store.TieredStore`.
WRITE_POLICIES = ("write_through", "write_back", "write_through_selective")
#: Lookup walks of :class:`~kvlab.tiers.store.TieredStore`.
WALKS = ("per_block", "opal")
#: Engines of :func:`~kvlab.tiers.replay.replay_tiered`.
ENGINES = ("auto", "kernel", "reference")


def tier_policies() -> list[str]:
    """Registered policies a tier can run (those whose reference does not read the trace).

    Example:
        >>> tier_policies()[:3]
        ['arc', 'fifo', 'lfu']
    """
    return sorted(n for n, s in POLICIES.items() if not s.reference_uses_trace)


def check_keys(keys: object) -> tuple[int, ...]:
    """Block keys as a tuple of u64 ints.

    Raises:
        ValueError: not a sequence, or an item that is not an integer in ``[0, 2**64)``
            (names ``keys[i]``).

    Example:
        >>> check_keys([1, 2**64 - 1])
        (1, 18446744073709551615)
    """
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Iterable):
        raise ValueError(f"keys must be a sequence of block keys (integers in [0, 2**64)), got {keys!r}")
    return tuple(check_u64(f"keys[{i}]", key) for i, key in enumerate(keys))


@dataclass(frozen=True)
class TierSpec:
    """One tier's configuration, checked on construction.

    Attributes:
        name: the tier's name (the KV events' ``medium``), non-empty.
        capacity_blocks: maximum resident blocks (``>= 0``), ``None`` = unbounded.
        policy: a :mod:`kvlab.policies` name whose reference does not read the whole trace
            (:func:`tier_policies`), or ``None`` (``"none"`` is accepted for it): never
            evict — a block that does not fit is not stored there.

    Raises:
        ValueError: an empty name, a bad capacity, an unknown policy or one that reads the
            whole trace (``belady``, ``length_aware``, ``leaf_first_lru``: their
            per-reference facts belong to a trace position, and a block moved between
            tiers has none).

    Example:
        >>> TierSpec("CPU", 8_000, "s3fifo").policy, TierSpec("NVMe", None, "none").policy
        ('s3fifo', None)
    """

    name: str
    capacity_blocks: int | None
    policy: str | None = "lru"

    def __post_init__(self) -> None:
        check_str("tier name", self.name, nonempty=True)
        object.__setattr__(self, "capacity_blocks",
                           check_count(f"tier {self.name!r}: capacity_blocks", self.capacity_blocks, optional=True))
        policy = None if self.policy == "none" else self.policy
        if policy is not None and policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r} for tier {self.name!r}; tier policies: {tier_policies()} "
                             f"or None")
        if policy is not None and POLICIES[policy].reference_uses_trace:
            raise ValueError(f"policy {policy!r} of tier {self.name!r} reads the whole trace and cannot run in a "
                             f"tier; tier policies: {tier_policies()} or None")
        object.__setattr__(self, "policy", policy)


def tier_specs(tiers: object) -> tuple[TierSpec, ...]:
    """``tiers`` as :class:`TierSpec` objects (``(name, capacity_blocks[, policy])`` tuples
    accepted).

    Raises:
        ValueError: not a list of tiers, an item that is neither a TierSpec nor a 2- or
            3-tuple, or a bad tier.

    Example:
        >>> tier_specs([("GPU", 2), TierSpec("CPU", None, None)])[0]
        TierSpec(name='GPU', capacity_blocks=2, policy='lru')
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
    return tuple(specs)


@dataclass(frozen=True)
class TieredConfig:
    """What a tiered replay runs, checked on construction (:func:`~kvlab.tiers.replay.replay_tiered`
    documents each field; :class:`~kvlab.tiers.store.TieredStore` takes the first five).

    Attributes:
        tiers: the tiers, fastest first (``TierSpec`` or ``(name, capacity_blocks[,
            policy])`` tuples; stored as a tuple of :class:`TierSpec`), names unique.
        write_policy: one of :data:`WRITE_POLICIES`.
        promote: copy (move, under write-back) a lower-tier hit up, or serve it in place.
        selective_hits: uses of a block before ``write_through_selective`` copies it down (``>= 1``).
        walk: one of :data:`WALKS`.
        touch_order: one of :data:`kvlab.core.TOUCH_ORDERS`.
        warmup_fraction: fraction in ``[0, 1)`` of the first requests excluded from the summary.
        engine: one of :data:`ENGINES`.

    Raises:
        ValueError: a bad field (names it and its value), no tiers, duplicate tier names.

    Example:
        >>> TieredConfig([("GPU", 2_000), ("CPU", 8_000, "s3fifo")]).tiers[1].policy
        's3fifo'
    """

    tiers: tuple[TierSpec, ...]
    write_policy: str = "write_back"
    promote: bool = True
    selective_hits: int = 2
    walk: str = "per_block"
    touch_order: str = "head_most_recent"
    warmup_fraction: float = 0.0
    engine: str = "auto"

    def __post_init__(self) -> None:
        specs = tier_specs(self.tiers)
        if not specs:
            raise ValueError("a tiered store needs at least one tier")
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"tier names must be unique, got {names}")
        object.__setattr__(self, "tiers", specs)
        check_choice("write_policy", self.write_policy, WRITE_POLICIES)
        object.__setattr__(self, "promote", check_flag("promote", self.promote))
        object.__setattr__(self, "selective_hits", check_positive("selective_hits", self.selective_hits))
        check_choice("walk", self.walk, WALKS)
        check_choice("touch_order", self.touch_order, TOUCH_ORDERS)
        w = check_real("warmup_fraction", self.warmup_fraction, low=0.0)
        if w >= 1.0:
            raise ValueError(f"warmup_fraction must be a number in [0, 1), got {self.warmup_fraction!r}")
        object.__setattr__(self, "warmup_fraction", w)
        check_choice("engine", self.engine, ENGINES)

    def warmup_requests(self, num_requests: int) -> int:
        """Number of leading requests excluded from the statistics."""
        return math.floor(self.warmup_fraction * num_requests)


@dataclass(frozen=True)
class LookupResult:
    """The combined prefix a lookup found: ``hit_blocks`` and the index of the tier that
    holds each of them (``tiers``, length ``hit_blocks``).

    Example:
        >>> LookupResult(3, (0, 0, 1)).blocks_per_tier(2)
        [2, 1]
    """

    hit_blocks: int
    tiers: tuple[int, ...]

    def blocks_per_tier(self, num_tiers: int) -> list[int]:
        """Hit blocks served by each tier, in tier order."""
        counts = [0] * num_tiers
        for t in self.tiers:
            counts[t] += 1
        return counts
