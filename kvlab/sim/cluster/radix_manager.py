"""A simulated worker's SGLang cache: kvlab's RadixCache behind the calls the worker makes.

The cluster worker (:mod:`kvlab.sim.cluster.worker`) schedules like vLLM v1 and talks to its cache
through :class:`~kvlab.engines.vllm.kv_cache_manager.KVCacheManager`'s calls
(``get_computed_blocks``, ``allocate_slots``, ``free``, ``preempt``, ``take_events``).
:class:`RadixManager` answers the same calls with SGLang 0.5.23's radix cache
(:class:`~kvlab.engines.sglang.radix_cache.RadixCache`, rules S1–S9 of docs/specs/engines.md §2.1)
and its slot allocator, using only their public methods. Only the cache is SGLang's: admission
order, budgets and preemption stay the worker's (vLLM's).

**One radix token per block.** A trace names a prompt by chained u64 block keys, one per full
block of ``block_size`` tokens, not by tokens. SGLang with ``page_size = block_size`` matches,
inserts, splits and evicts only at page boundaries, so its tree over the tokens has the same
shape as a tree over pages. The manager therefore runs the cache with ``page_size = 1`` over
one radix "token" per block key and one allocator slot per block (a page of ``block_size`` KV
tokens = one slot; ``kv_pool_size = capacity_blocks``)::

    tokens    [t0 … t15 | t16 … t31 | t32 … t40]      block_size 16, 41 tokens
    blocks    [   k0    |    k1     | tail      ]     two keyed full blocks, a partial tail
    radix     [ id(k0)  ,  id(k1) ]                 page_size 1; the tail has no key
    slots     [   s0    ,    s1     ,   s2      ]     ceil(41 / 16) slots held while running

Block keys are u64 but SGLang's token ids are int64, so each key is given a dense id
(``1, 2, …``, in order of first sight; 0 is the placeholder for the last sampled token of
:meth:`RadixCache.cache_finished_req`). Equal ids mean equal keys, so the tree is exact.

**Per call** (SGLang's scheduler calls in brackets):

* ``get_computed_blocks`` — ``match_prefix`` over the first ``(num_tokens − 1) // block_size``
  blocks: SGLang matches ``tokens[:-1]`` page aligned (S3), the same count as vLLM's
  ``(P − 1) // bs`` rule. It mutates the tree (recency, splits) as SGLang's match does, once per
  scheduling attempt (``init_next_round_input``).
* ``allocate_slots`` — at admission ``inc_lock_ref`` the matched node; then slots for
  ``ceil((num_computed_tokens + new) / block_size)`` blocks minus those held, derived from
  ``num_computed_tokens`` at every call (the worker may advance it by one without a call when no
  block is filled or started). Admission checks ``available + evictable`` (S6, SGLang's
  ``PrefillAdder`` / ``check_decode_mem``) first, so a refusal changes nothing (the lock is
  undone); when the free slots fall short, ``evict(need)`` — SGLang's ``evict_from_tree_cache``
  evicts the whole request size, not the shortfall — unlocked leaves first (S7), then ``alloc``.
* :meth:`begin_schedule` (the worker calls it before each step is scheduled) —
  ``cache_unfinished_req`` (S5) for requests that prefilled in the step that just ended: the
  computed full blocks of the prompt (up to the request's length at admission, SGLang's
  ``fill_ids``) are inserted, duplicates freed, the lock moved to the re-matched node. So, as in
  SGLang, a prompt is matchable from the step after its prefill — vLLM caches a block when it is
  allocated, so a request scheduled in the same step as a sharer hits in vLLM and misses here.
* ``free`` — ``cache_finished_req``: the full blocks of ``num_computed_tokens`` stay in the tree,
  duplicates and the partial tail are freed, the lock released (S5).
* ``preempt`` — SGLang's ``retract_decode``: the slots past the prefix the tree holds
  (``prefix_indices``) are freed *without* inserting them, the lock released; the prompt stays
  cached (it was inserted after its prefill), the tokens decoded since do not (vLLM keeps them,
  C19), so a preempted request re-prefills its own output.
* ``take_events`` — the cache's KV events (S9) with SGLang's page ids renamed to the block keys
  they stand for (both are injective in the prefix, so the renaming is a bijection on resident
  pages) and ``block_size`` the engine's: the cluster loop recovers tokens from block keys
  (:meth:`~kvlab.sim.cluster.prompts.PromptSource.event_tokens`) and an index keeps engine keys,
  exactly as for vLLM.

Not modelled: SGLang's own scheduler (``PrefillAdder`` budgets, ``new_token_ratio``, LPM order),
HiCache, the paged allocator's page rounding beyond the block mapping.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvlab.core.validate import check_count, check_flag, check_positive
from kvlab.engines.sglang.radix_cache import MatchResult, RadixCache
from kvlab.engines.sglang.tree_node import RadixKey, TreeNode, matched_len
from kvlab.engines.vllm.request import Request
from kvlab.events.types import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

#: Radix token of "no block": the last sampled token :meth:`RadixCache.cache_finished_req` drops.
_NO_BLOCK = 0


@dataclass
class _Held:
    """What SGLang's ``Req`` keeps for the cache while the request runs."""

    request: Request
    last_node: TreeNode
    slots: list[int]
    """One slot per block the request holds, in block order (``req_to_token``)."""
    prefix_blocks: int
    """Leading slots the tree holds for it, locked through ``last_node`` (``prefix_indices``)."""
    fill_tokens: int
    """Its length at admission: the tokens this prefill computes (``fill_ids``)."""


class RadixManager:
    """SGLang's radix cache with KVCacheManager's calls, one radix token and slot per block.

    Models SGLang 0.5.23 ``RadixCache`` + ``TokenToKVPoolAllocator`` as its scheduler drives them
    (module docstring for the mapping and each call).

    Args:
        capacity_blocks: KV slots (blocks) of the worker (>= 1).
        block_size: tokens per block (>= 1).
        enable_caching: prefix caching on (off: SGLang's ``--disable-radix-cache``: nothing is
            matched or inserted).
        eviction_policy: SGLang's ``--radix-eviction-policy`` (default ``"lru"``).
        enable_kv_cache_events: record KV events for :meth:`take_events`.

    Raises:
        ValueError: a bad argument (names it).

    Example:
        >>> m = RadixManager(8, block_size=4)
        >>> a = Request.from_block_keys("a", 10, [11, 12])
        >>> hit, hit_tokens = m.get_computed_blocks(a)
        >>> len(m.allocate_slots(a, 10, hit_tokens, hit)), m.num_free_blocks()
        (3, 5)
        >>> m.free(a)
        >>> m.num_cached_blocks(), m.num_free_blocks(), m.cached_prefix_blocks([11, 12, 13])
        (2, 8, 2)
        >>> b = Request.from_block_keys("b", 9, [11, 12])
        >>> m.get_computed_blocks(b)[1]  # (9 - 1) // 4 = 2 blocks
        8
    """

    def __init__(self, capacity_blocks: int, *, block_size: int, enable_caching: bool = True,
                 eviction_policy: str = "lru", enable_kv_cache_events: bool = False) -> None:
        self.block_size = check_positive("block_size", block_size)
        self.enable_caching = check_flag("enable_caching", enable_caching)
        self.cache = RadixCache(page_size=1, eviction_policy=eviction_policy,
                                kv_pool_size=check_positive("capacity_blocks", capacity_blocks),
                                enable_kv_cache_events=enable_kv_cache_events)
        self.cache.take_events()  # the AllBlocksCleared of construction: vLLM's pool starts silent
        self.allocator = self.cache.allocator
        self._ids: dict[int, int] = {}  # block key -> radix token id
        self._keys: list[int] = [_NO_BLOCK]  # radix token id -> block key
        self._event_keys: dict[int, int] = {}  # published SGLang page id -> block key (resident pages)
        self._held: dict[str, _Held] = {}
        self._prefilling: dict[str, _Held] = {}  # computed prompt blocks not inserted yet

    # ------------------------------------------------------------------ keys
    def _token(self, key: int) -> int:
        tid = self._ids.get(key)
        if tid is None:
            tid = self._ids[key] = len(self._keys)
            self._keys.append(key)
        return tid

    def _known_tokens(self, keys: Sequence[int]) -> list[int]:
        """Token ids of the leading keys that ever had one (a key without one is in no tree)."""
        out = []
        for k in keys:
            tid = self._ids.get(k)
            if tid is None:
                break
            out.append(tid)
        return out

    def _check(self, er: Request) -> None:
        if not isinstance(er, Request):
            raise ValueError(f"request must be a Request, got {type(er).__name__}")
        held = self._held.get(er.request_id)
        if held is not None and held.request is not er:
            raise ValueError(f"request id {er.request_id!r} is held by another live Request object")

    # ------------------------------------------------------------------ lookups
    def get_computed_blocks(self, er: Request) -> tuple[MatchResult, int]:
        """SGLang's match of ``er``'s first ``(num_tokens − 1) // block_size`` blocks: the
        :class:`~kvlab.engines.sglang.radix_cache.MatchResult` (give it back to
        :meth:`allocate_slots`) and the hit in tokens. Mutates recency and may split a node (S2).

        Raises:
            ValueError: not a Request, or its id is held by another Request object.
        """
        self._check(er)
        num = (er.num_tokens - 1) // self.block_size if self.enable_caching else 0
        hit = self.cache.match_prefix([self._token(k) for k in er.block_hashes[:num]])
        return hit, hit.prefix_len * self.block_size

    def cached_prefix_blocks(self, keys: Sequence[int]) -> int:
        """Leading ``keys`` resident in the tree now; a pure walk (no recency, no split)."""
        return matched_len(self.cache.root, RadixKey(self._known_tokens(keys)), 1)

    def num_free_blocks(self) -> int:
        """Blocks an allocation can obtain now: free slots plus evictable ones (S6)."""
        return self.allocator.available_size() + self.cache.evictable_size()

    def num_cached_blocks(self) -> int:
        """Blocks in the tree (locked or not)."""
        return self.cache.evictable_size() + self.cache.protected_size()

    # ------------------------------------------------------------------ allocation
    def allocate_slots(self, er: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: MatchResult | Sequence = ()) -> list[int] | None:
        """Slots for ``num_new_tokens`` more tokens of ``er``, all or nothing (module docstring).

        On success ``er.num_computed_tokens`` becomes computed + hit + new, as KVCacheManager's.

        Returns:
            The new slots (possibly none), or ``None`` when they do not fit even after evicting
            every unlocked block (nothing changed then).

        Raises:
            ValueError: bad counts, hits given for a running request or not matching
                ``num_new_computed_tokens``, more tokens than ``er`` has.
        """
        self._check(er)
        num_new_tokens = check_positive("num_new_tokens", num_new_tokens)
        num_new_computed_tokens = check_count("num_new_computed_tokens", num_new_computed_tokens)
        held = self._held.get(er.request_id)
        if held is None:
            hit = new_computed_blocks if isinstance(new_computed_blocks, MatchResult) else None
            if hit is None and len(new_computed_blocks):
                raise ValueError("new_computed_blocks must be the MatchResult of get_computed_blocks")
            prefix = 0 if hit is None else hit.prefix_len
            if prefix * self.block_size != num_new_computed_tokens:
                raise ValueError(f"num_new_computed_tokens={num_new_computed_tokens} but the hit holds {prefix} "
                                 f"blocks of {self.block_size}")
            slots = [] if hit is None else hit.indices.tolist()
        elif num_new_computed_tokens or len(new_computed_blocks):
            raise ValueError(f"request {er.request_id!r} is running; only a new request takes prefix hits")
        else:
            slots = held.slots
        total = er.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        if total > er.num_tokens:
            raise ValueError(f"num_new_tokens={num_new_tokens} goes past the end of request {er.request_id!r}: "
                             f"{er.num_computed_tokens} + {num_new_computed_tokens} computed, {er.num_tokens} tokens")
        need = -(-total // self.block_size) - len(slots)
        if held is None:  # S6: the hit is protected before anything is evicted for the request
            last_node = self.cache.root if hit is None else hit.last_node
            self.cache.inc_lock_ref(last_node)
        new: list[int] = []
        if need > 0:
            if need > self.num_free_blocks():
                if held is None:
                    self.cache.dec_lock_ref(last_node)
                return None
            if self.allocator.available_size() < need:
                self.cache.evict(need)  # SGLang evict_from_tree_cache: the whole request size
            new = self.allocator.alloc(need).tolist()
            slots.extend(new)
        if held is None:
            held = self._held[er.request_id] = _Held(er, last_node, slots, prefix, er.num_tokens)
        er.num_computed_tokens = total
        if self.enable_caching and min(total, held.fill_tokens) // self.block_size > held.prefix_blocks:
            self._prefilling[er.request_id] = held
        return new

    def begin_schedule(self) -> None:
        """Insert what the last step prefilled (SGLang ``cache_unfinished_req``, S5): call before
        each step is scheduled."""
        for held in self._prefilling.values():
            self._cache_unfinished(held)
        self._prefilling.clear()

    def _cache_unfinished(self, held: _Held) -> None:
        er = held.request
        target = min(er.num_computed_tokens, held.fill_tokens) // self.block_size
        if target <= held.prefix_blocks:
            return
        key = RadixKey([self._token(k) for k in er.block_hashes[:target]])
        new_prefix = self.cache.insert(key, np.asarray(held.slots[:target], dtype=np.int64))
        if new_prefix > held.prefix_blocks:  # another request inserted these meanwhile: free ours
            self.allocator.free(held.slots[held.prefix_blocks:new_prefix])
        hit = self.cache.match_prefix(key)
        self.cache.dec_lock_ref(held.last_node)
        self.cache.inc_lock_ref(hit.last_node)
        held.slots[:target] = hit.indices.tolist()
        held.last_node, held.prefix_blocks = hit.last_node, target

    # ------------------------------------------------------------------ release
    def _release(self, er: Request) -> _Held:
        self._check(er)
        held = self._held.pop(er.request_id, None)
        self._prefilling.pop(er.request_id, None)
        if held is None:
            raise ValueError(f"request {er.request_id!r} holds no slots; only a running request can be released")
        return held

    def free(self, er: Request) -> None:
        """The request finished: ``cache_finished_req`` over its computed full blocks (S5), the
        partial tail freed, the lock released. A request holding nothing is a no-op.

        Raises:
            ValueError: not a Request, or its id is held by another Request object.
        """
        self._check(er)
        if er.request_id not in self._held:
            return
        held = self._release(er)
        full = er.num_computed_tokens // self.block_size if self.enable_caching else 0
        key = [self._token(k) for k in er.block_hashes[:full]] + [_NO_BLOCK]
        self.cache.cache_finished_req(key, np.asarray(held.slots[:full], dtype=np.int64), held.last_node)
        if len(held.slots) > full:
            self.allocator.free(held.slots[full:])

    def preempt(self, er: Request) -> None:
        """SGLang's ``retract_decode``: the slots past the tree-held prefix freed without inserting
        them, the lock released; ``num_computed_tokens = 0``, ``num_preemptions += 1``.

        Raises:
            ValueError: ``er`` holds no slots (not running), or another Request holds its id.
        """
        held = self._release(er)
        if len(held.slots) > held.prefix_blocks:
            self.allocator.free(held.slots[held.prefix_blocks:])
        self.cache.dec_lock_ref(held.last_node)
        er.num_computed_tokens = 0
        er.num_preemptions += 1

    # ------------------------------------------------------------------ events
    def take_events(self) -> list[KVEvent]:
        """The cache's KV events since the last call (S9, coalesced as SGLang queues them), page
        ids renamed to block keys and ``block_size`` the engine's (module docstring)."""
        out: list[KVEvent] = []
        names = self._event_keys
        for e in self.cache.take_events():
            if isinstance(e, BlockStored):
                keys = tuple(self._keys[t] for t in e.token_ids)
                names.update(zip(e.block_hashes, keys, strict=True))
                parent = None if e.parent_block_hash is None else names[e.parent_block_hash]
                out.append(dataclasses.replace(e, block_hashes=keys, parent_block_hash=parent, token_ids=(),
                                               block_size=self.block_size))
            elif isinstance(e, BlockRemoved):
                out.append(dataclasses.replace(e, block_hashes=tuple(names.pop(h) for h in e.block_hashes)))
            else:
                if isinstance(e, AllBlocksCleared):
                    names.clear()
                out.append(e)
        return out

    def __repr__(self) -> str:
        return (f"RadixManager(block_size={self.block_size}, running={len(self._held)}, "
                f"free={self.allocator.available_size()}, cache={self.cache!r})")
