"""Eviction policies as small plug-ins, selected by name.

==========  ==========================================  ========================================
name        evicts                                      models
==========  ==========================================  ========================================
``lru``     the least recently used block               vLLM v1 free queue, LMCache, SGLang
==========  ==========================================  ========================================

Each policy module holds a readable reference class and numba kernel hooks
(:mod:`kvlab.policies.base` states the contract) and a ``SPEC`` registered here.
"""

from __future__ import annotations

from kvlab.policies import fifo, lfu, lru, s3fifo, sieve
from kvlab.policies.base import PolicySpec, ReferencePolicy

#: Registered policies by name.
POLICIES: dict[str, PolicySpec] = {spec.name: spec for spec in (lru.SPEC, fifo.SPEC, lfu.SPEC, s3fifo.SPEC,
                                                                sieve.SPEC)}


def register_policy(spec: PolicySpec) -> None:
    """Add a policy to the registry (kvlab's own, or a researcher's plug-in).

    Registering the same spec again is a no-op.

    Raises:
        ValueError: not a :class:`PolicySpec`, or its name is taken by another spec.

    Example:
        >>> register_policy(POLICIES["lru"])  # already there: nothing happens
    """
    if not isinstance(spec, PolicySpec):
        raise ValueError(f"expected a PolicySpec, got {type(spec).__name__}")
    if POLICIES.get(spec.name, spec) is not spec:
        raise ValueError(f"a different policy is already registered as {spec.name!r}")
    POLICIES[spec.name] = spec


def get_policy(name: str) -> PolicySpec:
    """Look up a policy by name.

    Raises:
        ValueError: unknown name (the message lists the known ones).

    Example:
        >>> get_policy("lru").summary
        'evict the least recently used block'
    """
    try:
        return POLICIES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown policy {name!r}; known policies: {sorted(POLICIES)}") from None


__all__ = ["POLICIES", "PolicySpec", "ReferencePolicy", "get_policy", "register_policy"]
