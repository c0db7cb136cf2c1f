"""SGLang's RadixCache: a radix tree of token spans mapping prefixes to KV slots.

Models ``sgl-project/sglang : python/sglang/srt/mem_cache/radix_cache.py :: RadixCache``
(SGLang 0.5.x, rules S1–S9 of docs/specs/engines.md §2.1). One request's life::

    r = cache.match_prefix(tokens[:-1])       S2/S3: page-aligned hit; may split a node
    cache.inc_lock_ref(r.last_node)           S6: the hit is protected while running
    own = cache.allocator.alloc(len(tokens) - 1 - r.prefix_len)   (prefill + decode KV)
    cache.cache_finished_req(tokens, [*r.indices, *own], r.last_node)
                                              S5: insert, free duplicates + tail, unlock
    cache.evict(n)                            S7: whole unlocked leaves, lowest score first

Unlike vLLM's lookup, ``match_prefix`` mutates the tree (splits, recency). Eviction
removes only leaves, so residency is prefix-closed (S8). Differences from upstream, all
for determinism: times are ticks of a logical clock (one per ``match_prefix`` /
``insert``, shared by every node that operation stamps), node ids come from a
per-instance counter, and eviction ties (same score, same tick) go to the lower node id
— the node SGLang's monotonic clock would have stamped first.

KV events (rule S9, ``enable_kv_cache_events``; ids and format in
:mod:`kvlab.blockpool.radix_events`): ``BlockStored`` per page of a new leaf,
``BlockRemoved`` per evicted node, ``AllBlocksCleared`` on reset and at construction
(SGLang's ``__init__`` calls ``reset``). A split publishes nothing: page ids are chained,
so they survive it (SGLang PRs #13488, #14934). ``split_events=True`` restores the
mid-2025 remove(old node) + store(upper half) + store(lower half) that spec S9 describes.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from kvlab.blockpool.radix_alloc import TokenSlotAllocator, check_slots
from kvlab.blockpool.radix_key import RadixKey, TreeNode, as_radix_key
from kvlab.blockpool.radix_policies import get_radix_policy
from kvlab.blockpool.radix_tree import RadixTreeBase, check_bool
from kvlab.blockpool.radix_view import iter_tree
from kvlab.hashing.base import check_count

_EMPTY = np.zeros(0, dtype=np.int64)


class MatchResult(NamedTuple):
    """What :meth:`RadixCache.match_prefix` found (SGLang ``MatchResult``).

    Example:
        >>> miss = RadixCache().match_prefix([1, 2])
        >>> miss.indices.tolist(), miss.last_node.node_id, miss.prefix_len
        ([], 0, 0)
    """

    indices: np.ndarray
    """``int64[prefix_len]`` KV slots of the matched prefix, in token order."""
    last_node: TreeNode
    """The deepest matched node (the root on a miss); lock it while the request runs."""
    prefix_len: int
    """Matched tokens, a multiple of the page size."""


class RadixCache(RadixTreeBase):
    """SGLang's radix prefix cache with a simulated KV slot pool.

    Models SGLang ``RadixCache`` (rules S1–S9). Without ``kv_pool_size`` values default
    to the token ids, as in SGLang's ``create_simulated``; with it, values are slots of
    :attr:`allocator` and every freed token goes back to it.

    Args:
        page_size: tokens per page (SGLang ``--page-size``, >= 1); lookups and inserts
            are cut to whole pages.
        eviction_policy: a name of :data:`~kvlab.blockpool.radix_policies.RADIX_POLICIES`.
        kv_pool_size: slots of the simulated pool, or ``None`` for no pool.
        enable_kv_cache_events: record KV events for :meth:`take_events`.
        split_events: publish remove + store events on a node split (mid-2025 SGLang).

    Attributes:
        policy: the eviction policy object (``policy.name`` is its name).
        allocator: the :class:`~kvlab.blockpool.radix_alloc.TokenSlotAllocator`, or
            ``None`` without ``kv_pool_size``.
        root, clock: see :class:`~kvlab.blockpool.radix_tree.RadixTreeBase`.

    Raises:
        ValueError: a bad argument (names it and its value; an unknown policy lists the
            known ones).

    Example:
        >>> cache = RadixCache(page_size=1, kv_pool_size=16)
        >>> slots = cache.allocator.alloc(4)
        >>> cache.insert([1, 2, 3, 4], slots)
        0
        >>> hit = cache.match_prefix([1, 2, 9])
        >>> hit.indices.tolist(), hit.prefix_len
        ([1, 2], 2)
        >>> print(cache.pretty())
        root #0 r=1
          [1 2] #2 r=0 hit=1 t=2
            [3 4] #1 r=0 hit=1 t=2
        tokens 4: evictable 4, protected 0
        >>> cache.evict(1), cache.allocator.free_slots().tolist()[-2:]
        (2, [3, 4])
    """

    def __init__(self, page_size: int = 1, eviction_policy: str = "lru", kv_pool_size: int | None = None,
                 enable_kv_cache_events: bool = False, *, split_events: bool = False) -> None:
        self.policy = get_radix_policy(eviction_policy)
        self.allocator = None if kv_pool_size is None else TokenSlotAllocator(kv_pool_size)
        super().__init__(page_size, enable_kv_cache_events, split_events)

    @classmethod
    def create_simulated(cls, page_size: int = 1, enable_kv_cache_events: bool = False) -> RadixCache:
        """A cache without a KV pool (values are token ids), LRU eviction.

        Models SGLang ``RadixCache.create_simulated``.

        Raises:
            ValueError: bad ``page_size`` or flag.
        """
        return cls(page_size=page_size, enable_kv_cache_events=enable_kv_cache_events)

    # ----- public API ---------------------------------------------------------------

    def match_prefix(self, key: RadixKey | Sequence[int]) -> MatchResult:
        """The longest cached prefix of ``key``, in whole pages.

        Models SGLang ``RadixCache.match_prefix`` / ``_match_prefix_helper`` (rule S2):
        the key is cut to a page multiple (a key shorter than a page matches nothing and
        touches nothing); every visited node, the root included, gets
        ``last_access_time = now``; when the match ends inside a node, that node is
        split there (the upper half copies ``lock_ref``, ``hit_count`` and ``priority``)
        and the upper half is ``last_node``. Only the key's namespace is searched (S1).

        Raises:
            ValueError: ``key`` neither a :class:`RadixKey` nor a token sequence.
        """
        key = as_radix_key(key).page_aligned(self.page_size)
        if len(key) == 0:
            return MatchResult(_EMPTY, self.root, 0)
        now = self._tick()
        node, values = self.root, []
        node.last_access_time = now
        while len(key) and (child := node.children.get(key.child_key(self.page_size))) is not None:
            child.last_access_time = now
            matched = child.key.match(key, self.page_size)
            if matched < len(child.key):
                node = self._split_node(child, matched)
                values.append(node.value)
                break
            values.append(child.value)
            node, key = child, key[matched:]
        indices = np.concatenate(values) if values else _EMPTY
        return MatchResult(indices, node, len(indices))

    def insert(self, key: RadixKey | Sequence[int], value: Sequence[int] | np.ndarray | None = None,
               priority: int = 0, chunked: bool = False) -> int:
        """Insert ``key`` with KV slots ``value``; return the prefix length already cached.

        Models SGLang ``RadixCache.insert`` / ``_insert_helper`` (rule S4): the key is cut
        to a page multiple (a key shorter than a page inserts nothing); the root and
        every walked node get ``last_access_time = now`` and ``priority = max(...)``;
        walked nodes get ``hit_count += 1`` unless ``chunked``; a partial match splits;
        the rest becomes a new leaf (``hit_count`` 1, or 0 when chunked). The caller
        still owns ``value[:returned]`` (duplicates of cached slots) and the unaligned
        tail; :meth:`cache_finished_req` frees them.

        Args:
            key: the tokens (and namespace).
            value: ``int[len(key)]`` KV slots of those tokens; ``None`` means the token
                ids themselves (only without a KV pool).
            priority: request priority (any int; higher survives ``priority`` eviction).
            chunked: a chunked-prefill step (no hit counting).

        Raises:
            ValueError: a bad key, priority or flag; ``value`` missing while the cache
                has a KV pool, of another length than ``key``, or holding slots that are
                not allocated from the pool.
        """
        key = as_radix_key(key)
        value = self._check_value(key, value)
        if isinstance(priority, bool) or not isinstance(priority, (int, np.integer)):
            raise ValueError(f"priority must be an integer, got {priority!r}")
        priority = int(priority)
        check_bool("chunked", chunked)
        key = key.page_aligned(self.page_size)
        value = value[:len(key)]
        now = self._tick()
        node, prefix_len = self.root, 0
        node.last_access_time = now
        node.priority = max(node.priority, priority)
        while len(key) and (child := node.children.get(key.child_key(self.page_size))) is not None:
            child.last_access_time = now
            matched = child.key.match(key, self.page_size)
            if matched < len(child.key):
                child = self._split_node(child, matched)
            child.priority = max(child.priority, priority)
            child.hit_count += 0 if chunked else 1
            node, key, value, prefix_len = child, key[matched:], value[matched:], prefix_len + matched
        if len(key):
            self._add_leaf(node, key, value, priority, 0 if chunked else 1)
        return prefix_len

    def cache_finished_req(self, key: RadixKey | Sequence[int], kv_indices: Sequence[int] | np.ndarray,
                           last_node: TreeNode, *, priority: int = 0) -> int:
        """Cache a finished request, free the slots the tree does not keep, and unlock it.

        Models SGLang ``RadixCache.cache_finished_req`` (rule S5): inserts
        ``key[:-1]`` (the last sampled token has no KV yet) cut to a page multiple;
        frees the request's own slots for the part another request inserted meanwhile
        (``kv_indices[prefix_len_at_match : returned_prefix_len]`` — de-duplication) and
        for the unaligned tail; then ``dec_lock_ref(last_node)``.

        Args:
            key: the request's input + output tokens (and namespace).
            kv_indices: ``int[len(key) - 1]`` the request's KV slots: the slots
                :meth:`match_prefix` returned, then its own.
            last_node: the locked ``last_node`` of that match.
            priority: request priority.

        Returns:
            The number of the request's slots returned to the pool.

        Raises:
            ValueError: ``kv_indices`` of the wrong length or not allocated; a
                ``last_node`` not in this tree, of another namespace, or whose path is
                not the start of ``key`` / ``kv_indices``. Nothing changes then.
            RuntimeError: ``last_node`` is not locked (an unlock without a lock).
        """
        key = as_radix_key(key)
        path = self._path_to_root(last_node, "last_node")
        self._check_unlockable(path)
        kv = check_slots("kv_indices", kv_indices, self.allocator)
        if len(key) == 0:
            raise ValueError("key must hold at least one token (the last sampled one has no KV)")
        if len(kv) != len(key) - 1:
            raise ValueError(f"kv_indices must hold len(key) - 1 = {len(key) - 1} slots (the last token has no KV), "
                             f"got {len(kv)}")
        if path and path[0].key.extra_key != key.extra_key:
            raise ValueError(f"last_node is in namespace {path[0].key.extra_key!r}, key in {key.extra_key!r}")
        nodes = path[::-1]
        cached_tokens = tuple(t for n in nodes for t in n.key.token_ids)
        cached_slots = np.concatenate([n.value for n in nodes]) if nodes else _EMPTY
        protected_len = len(cached_tokens)
        if key.token_ids[:protected_len] != cached_tokens or not np.array_equal(kv[:protected_len], cached_slots):
            raise ValueError(f"last_node's path ({protected_len} tokens) must be the start of key and kv_indices "
                             f"(the request's matched prefix)")
        new_prefix_len = self.insert(key[:len(kv)], kv, priority)
        aligned_len = len(kv) // self.page_size * self.page_size
        released = np.concatenate([kv[protected_len:new_prefix_len], kv[aligned_len:]])
        self._free(released)
        self.dec_lock_ref(last_node)
        return len(released)

    def inc_lock_ref(self, node: TreeNode) -> int:
        """Lock ``node`` and its ancestors against eviction (one count per request).

        Models SGLang ``RadixCache.inc_lock_ref`` (rule S6): walks node → root adding 1;
        a node going 0 → 1 moves its tokens from evictable to protected.

        Returns:
            Tokens moved from evictable to protected.

        Raises:
            ValueError: ``node`` is not in this tree (evicted, reset, another cache's).
        """
        moved = 0
        for n in self._path_to_root(node, "node"):
            if n.lock_ref == 0:
                moved += len(n.key)
                self._shift_to_protected(len(n.key))
            n.lock_ref += 1
            self._update_leaf_status(n)
        return moved

    def dec_lock_ref(self, node: TreeNode) -> int:
        """Undo one :meth:`inc_lock_ref`. Models SGLang ``RadixCache.dec_lock_ref`` (S6).

        Returns:
            Tokens moved from protected back to evictable.

        Raises:
            ValueError: ``node`` is not in this tree.
            RuntimeError: a lock count on the path would go below 0 (nothing changes).
        """
        path = self._path_to_root(node, "node")
        self._check_unlockable(path)
        moved = 0
        for n in path:
            n.lock_ref -= 1
            if n.lock_ref == 0:
                moved += len(n.key)
                self._shift_to_protected(-len(n.key))
            self._update_leaf_status(n)
        return moved

    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` tokens' slots if possible, leaf by leaf.

        Models SGLang ``RadixCache.evict`` (rule S7): a min-heap of the evictable leaves
        (unlocked, childless), built once from ``(policy score, last_access_time,
        node_id)``; pop, free the slots, delete the node; a parent left unlocked and
        childless is pushed; stop once ``num_tokens`` are freed. Whole nodes only, so
        the result can exceed ``num_tokens``; it is smaller only when nothing else is
        evictable.

        Returns:
            Tokens freed.

        Raises:
            ValueError: ``num_tokens`` not an integer >= 0.
        """
        num_tokens = check_count(num_tokens, "num_tokens")
        heap = [self._heap_entry(n) for n in self._evictable_leaves.values()]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            node = heapq.heappop(heap)[-1]
            parent = node.parent
            self._free(node.value)
            freed += len(node.value)
            self._delete_leaf(node)
            if not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, self._heap_entry(parent))
            self._events.record_remove(node)
        return freed

    def reset(self) -> bool:
        """Drop the whole tree, returning its slots to the pool, and publish
        ``AllBlocksCleared``.

        Models SGLang ``RadixCache.reset`` as ``Scheduler.flush_cache`` calls it: only
        when no request runs. The cache sees only locked requests and refuses then; one
        that matched nothing holds the old root and must not be finished after a reset.
        The clock and node ids keep counting, so nodes from before the reset are
        rejected as foreign.

        Returns:
            ``True`` when reset, ``False`` (nothing changed) while a node is locked.
        """
        if self._protected:
            return False
        for node, _ in iter_tree(self.root):
            self._free(node.value)
        self._new_tree()
        return True

    def __repr__(self) -> str:
        return (f"RadixCache(page_size={self.page_size}, eviction_policy={self.policy.name!r}, "
                f"tokens={self.total_size()}, evictable={self._evictable}, protected={self._protected})")

    # ----- internals ----------------------------------------------------------------

    def _heap_entry(self, node: TreeNode) -> tuple:
        return (self.policy.get_priority(node), node.last_access_time, node.node_id, node)

    def _check_value(self, key: RadixKey, value: object) -> np.ndarray:
        if value is None:
            if self.allocator is not None:
                raise ValueError("value is required when the cache has a KV pool (kv_pool_size is set); "
                                 "allocate slots with cache.allocator.alloc(n)")
            return np.asarray(key.token_ids, dtype=np.int64)
        arr = check_slots("value", value, self.allocator)
        if len(arr) != len(key):
            raise ValueError(f"value must hold one slot per token of key ({len(key)}), got {len(arr)}")
        return arr

    def _free(self, slots: np.ndarray) -> None:
        if self.allocator is not None and len(slots):
            self.allocator.free(slots)
