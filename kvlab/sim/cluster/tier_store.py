"""The tiers under the workers' GPU caches: one store per worker, or one shared pool (C20).

``cache_scope="local"``: each routable worker has its own :class:`~kvlab.tiers.store.TieredStore`
(the :class:`~kvlab.sim.cluster.config.ClusterTier` capacities); only it reads or writes it.
``cache_scope="global"``: one store of ``N ×`` those capacities shared by the ``N`` routable
workers — Mooncake Store as FAST'25 §5.3 and engines.md §5.1 describe it (M1–M2):

* every worker reads every block; a block lives in the DRAM segment of the worker that wrote
  it (its *home*, set when it enters the store), so a read of another worker's block is
  remote: the tier's device, then the network device (C14) instead of the host link;
* eviction is LRU ("unless the block is being accessed": blocks a load reads are pinned until
  it is done).

Either scope can run Mooncake Store's ``BatchEvict`` rounds: when a tier's usage reaches the
high watermark (0.9 of its capacity), about ``eviction_ratio`` (5 %) of its blocks are evicted at
once (M2); without a watermark a tier evicts one block when full.

A store publishes its changes as KV events (``medium`` = the tier's name) for the router's
index, under the worker's name (local) or :data:`STORE_POD` (global: a pod every worker reads).
Hot-block replication across segments (M1's multi-replica placement) is not modelled; hot
prefixes replicate on the GPUs through the Conductor's copies (§4.2).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvlab.core.validate import check_real
from kvlab.tiers.events import merge_runs, to_kv_events
from kvlab.tiers.store import TieredStore
from kvlab.tiers.types import TierSpec

#: Cache scopes (C20): a store per worker, or one pool every worker reads.
CACHE_SCOPES = ("local", "global")
#: The KV-event publisher (index pod) of the global store.
STORE_POD = "store"


class ClusterStore:
    """One store of tiers: a worker's own (local scope) or the cluster's pool (global scope).

    Args:
        tiers: ``(name, capacity_blocks, policy)`` per tier, fastest first (already scaled).
        write_policy: the :class:`~kvlab.tiers.store.TieredStore` write policy.
        block_size: engine block size, tokens (for the KV events).
        pod: its KV-event publisher name (the worker's, or :data:`STORE_POD`).
        shared: the global pool (blocks have homes) or a worker's own store.
        high_watermark: usage of a tier's capacity that starts an eviction round (``None``: no
            rounds, a full tier evicts one block per new one).
        eviction_ratio: the share of a tier's blocks one round evicts.
        publish: keep the KV events for :meth:`take_events` (only an index needs them).

    Raises:
        ValueError: a watermark or ratio outside ``(0, 1]``.

    Example:
        >>> pool = ClusterStore([("DRAM", 10, "lru")], "write_back", 16, STORE_POD, shared=True,
        ...                     high_watermark=0.9)
        >>> pool.put(list(range(1, 10)), writer=0)      # 9 of 10 blocks: the watermark's round
        >>> pool.tier_blocks("DRAM"), pool.remote_blocks([9, 8], reader=1)
        (8, 2)
    """

    def __init__(self, tiers: Sequence[tuple[str, int, str]], write_policy: str, block_size: int, pod: str, *,
                 shared: bool = False, high_watermark: float | None = None, eviction_ratio: float = 0.05,
                 publish: bool = False) -> None:
        self.store = TieredStore([TierSpec(*t) for t in tiers], write_policy=write_policy, block_size=block_size)
        self.pod, self.shared, self.publish = pod, shared, publish
        self.high_watermark = check_real("high_watermark", high_watermark, low=0.0, high=1.0, low_open=True,
                                         optional=True)
        self.eviction_ratio = check_real("eviction_ratio", eviction_ratio, low=0.0, high=1.0, low_open=True)
        self.homes: dict[int, int] = {}  # shared: block -> the worker whose segment holds it
        self.eviction_rounds = 0

    @property
    def tiers(self) -> list:
        """The store's :class:`~kvlab.tiers.tier.Tier` objects, fastest first."""
        return self.store.tiers

    def tier_blocks(self, tier: str) -> int:
        """Blocks resident in ``tier`` now."""
        return len(next(t for t in self.store.tiers if t.name == tier))

    def lookup(self, keys: Sequence[int]) -> tuple[int, ...]:
        """The tier index of each block of the contiguous prefix ``keys`` the store holds."""
        return self.store.lookup(keys).tiers

    def get(self, keys: Sequence[int], request_id: int) -> None:
        """A load reads ``keys`` (pinned until :meth:`release`; hits promoted per the policy)."""
        self.store.get(keys, request_id=request_id)
        if not self.publish:
            self.store.events.clear()

    def release(self, request_id: int) -> None:
        """The load of ``request_id`` is done: its blocks may be evicted again."""
        self.store.release(request_id)

    def put(self, keys: Sequence[int], writer: int) -> None:
        """Store computed blocks (head first) written by worker ``writer``; in the shared pool a
        block new to the store gets ``writer`` as its home. Then each tier at its high watermark
        runs an eviction round."""
        if self.shared:
            tiers = self.store.tiers
            for key in keys:
                if not any(key in t for t in tiers):
                    self.homes[key] = writer
        self.store.put(keys)
        if self.high_watermark is not None:
            for tier in self.store.tiers:
                cap = tier.capacity_blocks
                if cap is not None and len(tier) >= self.high_watermark * cap:
                    self.store.evict(tier.name, max(1, round(self.eviction_ratio * len(tier))))
                    self.eviction_rounds += 1
        if not self.publish:
            self.store.events.clear()

    def remote_blocks(self, keys: Sequence[int], reader: int) -> int:
        """How many of ``keys`` live in another worker's segment (0 for a worker's own store)."""
        if not self.shared:
            return 0
        homes = self.homes
        return sum(1 for key in keys if homes.get(key, reader) != reader)

    def take_events(self) -> list:
        """The KV events since the last call (``medium`` = tier name), oldest first."""
        events = to_kv_events(merge_runs(self.store.events), self.store.block_size)
        self.store.events.clear()
        return events


def build_stores(config: object, *, publish: bool) -> list[ClusterStore | None]:
    """Each worker's store, from a :class:`~kvlab.sim.cluster.config.ClusterConfig`: ``None``
    without tiers; each worker its own (local scope), or one pool of N × the tier capacities,
    N the routable (prefill or mixed) workers, that every worker shares (global scope)."""
    if not config.tiers:
        return [None] * config.num_workers
    scale = sum(role != "decode" for role in config.roles) if config.cache_scope == "global" else 1
    specs = [(t.name, t.capacity_blocks * scale, t.policy) for t in config.tiers]

    def store(pod: str, shared: bool) -> ClusterStore:
        return ClusterStore(specs, config.tier_write_policy, config.block_size, pod, shared=shared,
                            high_watermark=config.store_high_watermark, eviction_ratio=config.store_eviction_ratio,
                            publish=publish)

    pool = store(STORE_POD, True) if config.cache_scope == "global" else None
    return [pool or store(f"w{i}", False) for i in range(config.num_workers)]
