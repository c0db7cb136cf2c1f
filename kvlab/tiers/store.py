"""A tiered KV store: an ordered list of tiers, a write policy, promotion, pins, events.

The readable reference model (the oracle for the numba driver in
:mod:`kvlab.tiers.driver`). Blocks are u64 keys (one per block of a prompt, chained).

**Lookup** walks the blocks of a request in order and, for each, the tiers in order;
the first tier holding it answers and the walk stops at the first block no tier holds:
the combined contiguous prefix, with the tier of each hit block (Opal's rule, with each
block re-checked from the top tier: ``walk="opal"`` reproduces Opal's strict walk, which
never returns to a higher tier once it has moved down — docs/specs/index_blend.md O15,
T-O4). A lower tier is queried only for blocks the tiers above did not hold.

**Write policies** (what happens to a computed block, and to a tier's victims):

=============================  ===============================  ===============================
write policy                   computed block goes to           a tier's eviction victim
=============================  ===============================  ===============================
``write_through``              every tier (LMCache L5, KVBM)    is dropped from that tier
``write_back``                 the top tier                     moves to the next tier
                                                                (SGLang HiCache; the last drops)
``write_through_selective``    the top tier; lower tiers get a  is dropped from that tier
                               copy once the block has been
                               used ``selective_hits`` times
                               (KVBM's disk filter: 2)
=============================  ===============================  ===============================

Under ``write_back`` a block lives in one tier at a time (exclusive caching). The write
policies treat a top tier that cannot take a block (capacity 0, or full and never
evicting) differently: ``write_back`` spills the block to the next tier, the
write-through policies write the tiers they write anyway, so under
``write_through_selective`` such a block is cached nowhere until its copy-down. A tier
whose policy is ``None`` never evicts: a block that does not fit is not stored there
(under ``write_back`` it goes on to the next tier: Opal's store, O17).

**A hit in a lower tier** is promoted (``promote=True``: copied into every tier above,
or moved to the top tier under ``write_back``) or served in place (touched there).
``write_through_selective`` copies a block that reached ``selective_hits`` uses into
every tier below the top that lacks it (also tiers above the one serving it in place).

**Lower-tier policies under write-back with promotion** see each block once: a hit moves
it up, so a re-access never reaches the lower tier's policy, and recency-like policies
(LRU, FIFO, SIEVE, LFU, ARC) behave alike there; S3-FIFO, which admits through a small
queue, differs.

**Hits and reads.** A request's hit is fixed by its lookup; its blocks are then touched
in ``touch_order``, and inserting the tail first can evict a head block the lookup
counted (as in :func:`kvlab.sim.replay`): that block is then found where it went, or
recomputed, so a tier's ``read_blocks`` can be lower than its ``hit_blocks``; and a
resident block after a request's first miss is read (promoted) too — the touch of the
single-cache replay — so ``read_blocks`` can also be higher. KV events carry
``block_size`` (default 16: vLLM's block) — pass the trace's block size.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvlab.core.semantics import TOUCH_ORDERS
from kvlab.core.validate import check_choice, check_count, check_positive
from kvlab.tiers.events import TierEvent, to_kv_events
from kvlab.tiers.tier import Tier
from kvlab.tiers.types import WRITE_POLICIES, LookupResult, TieredConfig, TierSpec, check_keys

__all__ = ["WRITE_POLICIES", "LookupResult", "TierSpec", "TieredStore"]


class TieredStore:
    """Tiers in order (fastest first), a write policy, promotion on lower-tier hits.

    Models SGLang HiCache (write-back / write-through / selective, H3–H6), LMCache's
    storage manager (write-through to every backend, promotion into the CPU cache, L5–L6),
    Dynamo KVBM (G1–G4, frequency-filtered disk offload, K1–K4) and Opal's tiered store
    (lookup walk, O15–O17) — with eviction, tier tracking and events.

    Args:
        tiers: :class:`TierSpec` (or ``(name, capacity_blocks[, policy])`` tuples), fastest first.
        write_policy: one of :data:`WRITE_POLICIES`.
        promote: copy/move a lower-tier hit up (``True``) or serve it in place.
        selective_hits: uses of a block before ``write_through_selective`` copies it down.
        walk: ``"per_block"`` (default) or ``"opal"`` (see the module docstring).
        block_size: tokens per block, for the KV events.

    Raises:
        ValueError: no tiers, duplicate tier names, a bad option.

    Example:
        >>> store = TieredStore([("GPU", 2), ("CPU", 4)], write_policy="write_back")
        >>> store.access_request([1, 2, 3])            # 3 computed blocks; GPU holds 2
        LookupResult(hit_blocks=0, tiers=())
        >>> store.access_request([1, 2, 3]).tiers       # block 3 was demoted to the CPU
        (0, 0, 1)
        >>> store.tier_blocks()
        {'GPU': [1, 2], 'CPU': [3]}
    """

    def __init__(self, tiers: Sequence[TierSpec | tuple], *, write_policy: str = "write_back", promote: bool = True,
                 selective_hits: int = 2, walk: str = "per_block", block_size: int = 16) -> None:
        config = TieredConfig(tiers, write_policy=write_policy, promote=promote, selective_hits=selective_hits,
                              walk=walk)  # checks them
        block_size = check_positive("block_size", block_size)
        self.tiers = [Tier(s.name, s.capacity_blocks, s.policy) for s in config.tiers]
        self.write_policy, self.promote, self.walk = config.write_policy, config.promote, config.walk
        self.selective_hits = config.selective_hits
        self.block_size = block_size
        self.events: list[TierEvent] = []
        self._uses: dict[int, int] = {}  # block -> uses (for write_through_selective)
        self._pins: dict[object, list[tuple[int, int]]] = {}  # request -> [(tier, block)]
        self._clock = 0  # logical clock: the ref_index handed to the policies

    # ------------------------------------------------------------------ lookup

    def lookup(self, keys: Sequence[int]) -> LookupResult:
        """The combined contiguous prefix of ``keys`` over the tiers. Changes no
        residency; counts, per tier, the blocks it was asked about — all of them for the
        top tier, the rest of the request from the first block the tiers above did not
        hold for a lower one (an LMCache-style lookup of the suffix beyond the local hit,
        docs/specs/engines.md L3–L4) — and the blocks it answered."""
        found: list[int] = []
        asked_from = [-1] * len(self.tiers)
        start = 0
        for p, key in enumerate(keys):
            where = None
            for t in range(start, len(self.tiers)):
                if asked_from[t] < 0:
                    asked_from[t] = p
                if key in self.tiers[t]:
                    where = t
                    break
            if where is None:
                break
            self.tiers[where].counters.hit_blocks += 1
            found.append(where)
            if self.walk == "opal":
                start = where
        for t, p in enumerate(asked_from):
            self.tiers[t].counters.queried_blocks += len(keys) - p if p >= 0 else 0
        return LookupResult(len(found), tuple(found))

    # ------------------------------------------------------------------ requests

    def access_request(self, keys: Sequence[int], *, touch_order: str = "head_most_recent") -> LookupResult:
        """One request of a cache-level replay: look up, then serve every hit block and
        store every computed one, in ``touch_order`` (``"head_most_recent"``: the tail
        first, so the head ends most recent, as :func:`kvlab.sim.replay`)."""
        check_choice("touch_order", touch_order, TOUCH_ORDERS)
        keys = check_keys(keys)
        result = self.lookup(keys)
        order = range(len(keys) - 1, -1, -1) if touch_order == "head_most_recent" else range(len(keys))
        for i in order:
            self._access(keys[i])
        return result

    def get(self, keys: Sequence[int], request_id: object = None) -> LookupResult:
        """Look up ``keys`` and serve the hit prefix (promoting per the configuration),
        head first; with a ``request_id`` the served blocks are pinned where they end up
        until :meth:`release`."""
        keys = check_keys(keys)
        try:
            {request_id}  # noqa: B018 - a request id keys the pin table
        except TypeError:
            raise ValueError(f"request_id must be hashable (a str or int), got {request_id!r}") from None
        result = self.lookup(keys)
        if request_id is not None:
            self._pins.setdefault(request_id, [])
        for i in range(result.hit_blocks):
            t = self._access(keys[i])
            if request_id is not None and t is not None:
                self.tiers[t].pin(keys[i])
                self._pins[request_id].append((t, keys[i]))
        return result

    def put(self, keys: Sequence[int]) -> None:
        """Store computed blocks, head first, per the write policy (a block already in
        the top tier is touched)."""
        for key in check_keys(keys):
            self._access(key)

    def release(self, request_id: object) -> None:
        """Release the pins :meth:`get` took for ``request_id`` (possibly none).

        Raises:
            ValueError: no :meth:`get` with this ``request_id`` is outstanding.
        """
        if request_id not in self._pins:
            raise ValueError(f"request {request_id!r} holds no pinned blocks (no get() with it is outstanding)")
        for t, key in reversed(self._pins.pop(request_id)):
            self.tiers[t].unpin(key, self._tick())

    # ------------------------------------------------------------------ management

    def remove(self, keys: Iterable[int]) -> None:
        """Invalidate blocks in every tier (pinned copies stay until released)."""
        keys = check_keys(keys)
        for tier in self.tiers:
            gone = tuple(k for k in keys if k not in tier.pins and tier.remove(k))
            tier.counters.dropped_blocks += len(gone)
            self._emit("removed", tier.name, gone)

    def reset(self, tier: str | None = None) -> int:
        """Drop every unpinned block of ``tier`` (a name), or of every tier; returns the
        number removed. A reset of every tier with nothing pinned publishes one
        ``all_cleared`` event, otherwise one ``cleared`` event per tier.

        Raises:
            ValueError: an unknown tier name.
        """
        targets = self.tiers if tier is None else [self._tier(tier)]
        everything = tier is None and not any(t.pins for t in self.tiers)
        removed = 0
        for t in targets:
            keys = t.clear()
            removed += len(keys)
            if not everything:
                self._emit("cleared", t.name, tuple(keys))
        if everything:
            self.events.append(TierEvent("all_cleared", "", ()))
        return removed

    def evict(self, tier: str, num_blocks: int) -> int:
        """Evict up to ``num_blocks`` of ``tier``'s victims now, full or not (an eviction
        round, as Mooncake Store's ``BatchEvict`` runs at its high watermark, engines.md §5.1
        M2); victims follow the write policy. Returns the number evicted (fewer when the rest
        is pinned).

        Raises:
            ValueError: an unknown tier name, a negative count.
        """
        t = self.tiers.index(self._tier(tier))
        victims = self.tiers[t].evict(check_count("num_blocks", num_blocks))
        for victim in victims:
            self._after_eviction(t, victim)
        return len(victims)

    def set_capacity(self, tier: str, capacity_blocks: int | None) -> None:
        """Change a tier's capacity; victims of a shrink follow the write policy."""
        t = self.tiers.index(self._tier(tier))
        for victim in self.tiers[t].set_capacity(capacity_blocks):
            self._after_eviction(t, victim)

    # ------------------------------------------------------------------ views

    def tier_blocks(self) -> dict[str, list[int]]:
        """Resident blocks of each tier (sorted keys)."""
        return {t.name: sorted(t.resident()) for t in self.tiers}

    def counters(self) -> dict[str, dict[str, int]]:
        """Per-tier counters (see :class:`~kvlab.tiers.tier.TierCounters`)."""
        return {t.name: t.counters.to_dict() for t in self.tiers}

    def kv_events(self) -> list:
        """Every event so far as vLLM KV events (``medium`` = tier name)."""
        return to_kv_events(self.events, self.block_size)

    def check(self) -> None:
        """Assert every tier's invariants, and exclusivity under ``write_back``."""
        for tier in self.tiers:
            tier.check()
        if self.write_policy == "write_back":
            seen = [k for t in self.tiers for k in t.resident()]
            assert len(seen) == len(set(seen)), "write_back must keep each block in one tier"

    # ------------------------------------------------------------------ internals

    def _tier(self, name: str) -> Tier:
        for tier in self.tiers:
            if tier.name == name:
                return tier
        raise ValueError(f"unknown tier {name!r}; tiers: {[t.name for t in self.tiers]}")

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _emit(self, kind: str, tier: str, keys: tuple[int, ...], to_tier: str | None = None) -> None:
        if keys:
            self.events.append(TierEvent(kind, tier, keys, to_tier))

    def _access(self, key: int) -> int | None:
        """Serve ``key`` from the tier that holds it now, or store it as computed; returns
        the tier it is in afterwards (``None``: stored nowhere). A hit block evicted
        earlier in the same request is found where it went (or recomputed)."""
        t = next((t for t, tier in enumerate(self.tiers) if key in tier), None)
        return self._store(key) if t is None else self._serve(key, t)

    def _serve(self, key: int, t: int) -> int | None:
        """Read a resident block from tier ``t``; returns the tier it is in afterwards."""
        self.tiers[t].counters.read_blocks += 1
        self._uses[key] = self._uses.get(key, 0) + 1
        # exclusive promotion moves the block to the first tier above that can take it
        # (a pinned block stays put); with none, it is served in place
        up = next((u for u in range(t) if self.tiers[u].can_accept()), None) \
            if self.write_policy == "write_back" and key not in self.tiers[t].pins else None
        if t == 0 or not self.promote or (self.write_policy == "write_back" and up is None):
            self.tiers[t].touch(key, self._tick())
            self._copy_down_if_selected(key)
            return t
        if self.write_policy == "write_back":
            self.tiers[t].remove(key)
            self.tiers[t].counters.promoted_out_blocks += 1
            return self._insert(up, key, promoted_from=t)
        self.tiers[t].touch(key, self._tick())
        top = t
        for u in range(t - 1, -1, -1):  # copy into every tier above
            if self._insert(u, key, promoted_from=t) == u:
                top = u
        self._copy_down_if_selected(key)
        return top

    def _store(self, key: int) -> int | None:
        """Write a computed block (resident nowhere) per the write policy; returns the
        top tier it went into."""
        self._uses[key] = self._uses.get(key, 0) + 1
        if self.write_policy == "write_back":
            return self._insert(0, key)
        depth = len(self.tiers) if self.write_policy == "write_through" else 1
        placed = [t for t in range(depth) if self._insert(t, key) == t]
        self._copy_down_if_selected(key)
        return placed[0] if placed else None

    def _copy_down_if_selected(self, key: int) -> None:
        if self.write_policy != "write_through_selective" or self._uses.get(key, 0) < self.selective_hits:
            return
        source = next((t for t in self.tiers if key in t), None)
        for t in range(1, len(self.tiers)):
            if key not in self.tiers[t]:
                self._insert(t, key, copied_from=source)

    def _insert(self, t: int, key: int, *, promoted_from: int | None = None,
                copied_from: Tier | None = None) -> int | None:
        """Insert ``key`` into tier ``t`` (or, if it does not fit there under write-back,
        the next tier down); returns the tier it went into, or ``None``."""
        tier = self.tiers[t]
        try:
            victims = tier.insert(key, self._tick())
        except LookupError:  # capacity 0, full of pinned blocks, or a full tier that never evicts
            if self.write_policy == "write_back" and t + 1 < len(self.tiers):
                return self._insert(t + 1, key, promoted_from=promoted_from, copied_from=copied_from)
            return None
        if promoted_from is not None:
            tier.counters.promoted_in_blocks += 1
            kind = "moved" if self.write_policy == "write_back" else "copied"
            self._emit(kind, self.tiers[promoted_from].name, (key,), tier.name)
        elif copied_from is not None:
            self._emit("copied", copied_from.name, (key,), tier.name)
        else:
            self._emit("stored", tier.name, (key,))
        for victim in victims:
            self._after_eviction(t, victim)
        return t

    def _after_eviction(self, t: int, victim: int) -> None:
        """A victim of tier ``t``: under write-back moved to the first tier below that can
        take it (as a new block spills past tiers that cannot: capacity 0, full and never
        evicting, or full of pinned blocks), evicting there in turn; else dropped."""
        tier = self.tiers[t]
        u = next((u for u in range(t + 1, len(self.tiers)) if self.tiers[u].can_accept()), None) \
            if self.write_policy == "write_back" else None
        if u is None:
            self._emit("removed", tier.name, (victim,))
            return
        below = self.tiers[u]
        self.events.append(TierEvent("moved", tier.name, (victim,), below.name))
        tier.counters.demoted_out_blocks += 1
        below.counters.demoted_in_blocks += 1
        for v in below.insert(victim, self._tick()):
            self._after_eviction(u, v)
