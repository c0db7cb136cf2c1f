"""Eviction policies as small plug-ins, selected by name.

==================  ===============================================  ==========================================
name                evicts                                           models
==================  ===============================================  ==========================================
``lru``             the least recently used block                    vLLM v1 free queue, LMCache, SGLang
``fifo``            the oldest inserted block (hits do not reorder)  FIFO baseline (libCacheSim ``FIFO``)
``lfu``             the least frequently used block, LRU on ties     LFU baseline; Mooncake arXiv Table 1
``s3fifo``          small FIFO → main FIFO with ghost queue          Yang et al., SOSP'23 (libCacheSim ``S3FIFO``)
``sieve``           the first unvisited block under a moving hand    Zhang et al., NSDI'24 (libCacheSim ``Sieve``)
``arc``             adaptive between recency and frequency lists     Megiddo & Modha, FAST'03 (libCacheSim ``ARC``)
``length_aware``    lowest (count, position in request), LRU ties    Mooncake LengthAwareCache (arXiv 2407.00079)
``leaf_first_lru``  least recent block with no resident child        SGLang RadixCache leaf eviction
``belady``          the block next used furthest in the future       Belady's MIN (offline optimum, upper bound)
==================  ===============================================  ==========================================

Each policy module holds a readable reference class and numba kernel hooks
(:mod:`kvlab.policies.base` states the contract; :mod:`kvlab.policies.structs` holds the
list and heap the kernels share) and a ``SPEC`` registered here. Every policy but the three
that read the whole trace (``length_aware``, ``leaf_first_lru``, ``belady``) can also run in a
tier (:mod:`kvlab.tiers`).

Which "policy" a parameter takes
--------------------------------

Several of kvlab's parameters choose a rule and are called a policy; only the first row takes
these plug-ins:

=======================================================  ===================================================
parameter                                                takes
=======================================================  ===================================================
``policy`` of :func:`kvlab.replay` / ``ReplayConfig``,   a name of :data:`POLICIES` (``kvlab sweep
:func:`kvlab.sweep` (``--policies``), and a tier's       --policies``, ``--tier NAME=BLOCKS:POLICY``); a
policy (``kvlab.tiers.TierSpec``, ``--tier``)            tier also takes ``None`` / ``"none"``: never evict
``write_policy`` of :mod:`kvlab.tiers`                   where computed blocks and a tier's victims go:
(``TieredStore``, ``replay_tiered``,                     ``write_through``, ``write_back``,
``--write-policy``)                                      ``write_through_selective``
                                                         (``kvlab.tiers.WRITE_POLICIES``) — not an eviction
                                                         policy
``free_order`` of ``ReplayConfig`` (``mode="vllm"``)     vLLM v1's free-queue discipline: ``"current"`` or
                                                         ``"classic"`` (``kvlab.sim.vllm_kernel.FREE_ORDERS``);
                                                         the vLLM mode evicts in free-queue order, LRU
SGLang's radix cache (``kvlab.engines.sglang``)          SGLang's own eviction strategies
                                                         (``--radix-eviction-policy``, under their upstream
                                                         names): node scores of a radix tree, not these
                                                         plug-ins
=======================================================  ===================================================
"""

from __future__ import annotations

import re

from kvlab.policies import arc, belady, fifo, leaf_first_lru, length_aware, lfu, lru, s3fifo, sieve
from kvlab.policies.base import PolicySpec, ReferencePolicy

#: Registered policies by name.
POLICIES: dict[str, PolicySpec] = {spec.name: spec for spec in (
    lru.SPEC, fifo.SPEC, lfu.SPEC, s3fifo.SPEC, sieve.SPEC, arc.SPEC, length_aware.SPEC, leaf_first_lru.SPEC,
    belady.SPEC)}


def register_policy(spec: PolicySpec) -> None:
    """Add a policy to the registry (kvlab's own, or a researcher's plug-in).

    Registering the same spec again is a no-op.

    A plug-in is one module like :mod:`kvlab.policies.fifo`: a reference class, a state
    ``NamedTuple`` with kernel hooks registered by
    :func:`kvlab.policies.base.register_kernel`, and a ``SPEC`` passed here.

    Raises:
        ValueError: not a :class:`PolicySpec`, a name that is not lower-case
            ``[a-z][a-z0-9_]*``, non-callable parts, or a name taken by another spec.

    Example:
        >>> register_policy(POLICIES["lru"])  # already there: nothing happens
    """
    if not isinstance(spec, PolicySpec):
        raise ValueError(f"expected a PolicySpec, got {type(spec).__name__}")
    if not isinstance(spec.name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", spec.name):
        raise ValueError(f"a policy name is lower-case letters, digits and '_' (it is typed in --policies), "
                         f"got {spec.name!r}")
    if not callable(spec.reference) or not callable(spec.make_state):
        raise ValueError(f"policy {spec.name!r}: reference and make_state must be callables")
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
