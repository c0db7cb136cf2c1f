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
removes only leaves, so residency is prefix-closed (S8). The cache keeps SGLang's
counters incrementally::

    evictable_size + protected_size == tokens in the tree
    protected  = tokens of nodes with lock_ref > 0      (the root: lock_ref 1, no tokens)
    evictable leaves = unlocked, childless, non-root nodes  (eviction never walks the tree)

Differences from upstream, all for determinism: times are ticks of a logical clock (one
per ``match_prefix`` / ``insert``, shared by every node that operation stamps), node ids
come from a per-instance counter, and eviction ties (same score, same tick) go to the
lower node id — the node SGLang's monotonic clock would have stamped first.

KV events (rule S9, :mod:`kvlab.engines.sglang.events`): ``BlockStored`` per page of a
new leaf, ``BlockRemoved`` per evicted node, ``AllBlocksCleared`` on reset and at
construction; a split emits none unless ``split_events=True`` (mid-2025 SGLang). Not
modelled: S5's ``cache_unfinished_req`` (chunked prefill; ``insert(..., chunked=True)``
is its insert).

Checks SGLang does not make (:mod:`kvlab.engines.sglang.checks`): with a KV pool the cache
records which slots the tree holds and refuses new tokens whose slots the tree already
holds or that are not allocated, so no slot sits in two nodes; eviction and reset check
every slot before freeing any. Token ids must fit int64 (``< 2**63``), as SGLang's do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import polars as pl

from kvlab.core.validate import check_count, check_flag, check_int
from kvlab.engines.sglang.allocator import TokenToKVPoolAllocator
from kvlab.engines.sglang.checks import (
    TreeSlots,
    check_finished_request,
    check_insert_value,
    check_slots,
    check_unlockable,
    path_to_root,
)
from kvlab.engines.sglang.events import RadixEventRecorder
from kvlab.engines.sglang.evict_policy import get_eviction_strategy
from kvlab.engines.sglang.tree_node import (
    RadixKey,
    TreeNode,
    as_radix_key,
    iter_tree,
    matched_len,
    plan_eviction,
    tree_frame,
    tree_text,
)
from kvlab.events.types import KVEvent
from kvlab.hashing.base import check_block_size

#: The root's priority: SGLang's ``-sys.maxsize`` (any real priority overrides it).
ROOT_PRIORITY = -(2**63 - 1)
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


class RadixCache:
    """SGLang's radix prefix cache with a simulated KV slot pool.

    Models SGLang ``RadixCache`` (rules S1–S9; module docstring). Without
    ``kv_pool_size`` values default to the token ids, as in SGLang's ``create_simulated``;
    with it, values are slots of :attr:`allocator` and every freed token goes back to it.

    Args:
        page_size: tokens per page (SGLang ``--page-size``, >= 1); lookups and inserts
            are cut to whole pages.
        eviction_policy: SGLang's ``--radix-eviction-policy``: a name of
            :data:`~kvlab.engines.sglang.evict_policy.EVICTION_STRATEGIES` (not a
            :mod:`kvlab.policies` policy).
        kv_pool_size: slots of the simulated pool, or ``None`` for no pool.
        enable_kv_cache_events: record KV events for :meth:`take_events`.
        split_events: publish remove + store events on a node split (mid-2025 SGLang,
            spec S9); the default ``False`` publishes nothing then (current SGLang).

    Attributes:
        eviction_strategy: the strategy object (``eviction_strategy.name`` is its name).
        allocator: the :class:`~kvlab.engines.sglang.allocator.TokenToKVPoolAllocator`,
            or ``None`` without ``kv_pool_size``.
        tree_slots: the :class:`~kvlab.engines.sglang.checks.TreeSlots` record of the
            slots the tree holds, or ``None`` without ``kv_pool_size``.
        root: the root node (``lock_ref`` 1, no tokens); replaced by a reset.
        clock: the logical clock, ticked once per ``match_prefix`` / ``insert``.

    Raises:
        ValueError: a bad argument (names it and its value; an unknown strategy lists the
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
        self.eviction_strategy = get_eviction_strategy(eviction_policy)
        if kv_pool_size is None:
            self.allocator = self.tree_slots = None
        else:
            self.allocator = TokenToKVPoolAllocator(check_block_size(kv_pool_size, "kv_pool_size"))
            self.tree_slots = TreeSlots(self.allocator)
        self.page_size = check_block_size(page_size, "page_size")
        self.enable_kv_cache_events = check_flag("enable_kv_cache_events", enable_kv_cache_events)
        self.split_events = check_flag("split_events", split_events)
        self._events = RadixEventRecorder(enabled=self.enable_kv_cache_events, page_size=self.page_size)
        self.clock = 0
        self._next_id = 0
        self._new_tree()

    @classmethod
    def create_simulated(cls, page_size: int = 1, enable_kv_cache_events: bool = False) -> RadixCache:
        """A cache without a KV pool (values are token ids), LRU eviction.

        Models SGLang ``RadixCache.create_simulated``.

        Raises:
            ValueError: bad ``page_size`` or flag.
        """
        return cls(page_size=page_size, enable_kv_cache_events=enable_kv_cache_events)

    # ----- public API ---------------------------------------------------------------

    def evictable_size(self) -> int:
        """Tokens in unlocked nodes (SGLang ``evictable_size``)."""
        return self._evictable

    def protected_size(self) -> int:
        """Tokens in locked nodes (SGLang ``protected_size``)."""
        return self._protected

    def total_size(self) -> int:
        """Tokens in the tree, counted by a walk (SGLang ``total_size``)."""
        return sum(len(node.key) for node, _ in iter_tree(self.root))

    def take_events(self) -> list[KVEvent]:
        """The KV events recorded since the last call, oldest first; clears the queue.

        Models SGLang ``RadixCache.take_events``; always ``[]`` when events are off."""
        return self._events.take()

    def pretty(self) -> str:
        """The tree as text, one node per line (SGLang ``pretty_print``; format in
        :mod:`kvlab.engines.sglang.tree_node`), then the token counts."""
        return (f"{tree_text(self.root)}\n"
                f"tokens {self.total_size()}: evictable {self._evictable}, protected {self._protected}")

    def snapshot(self) -> pl.DataFrame:
        """One row per node, root first, depth-first: ``node_id``, ``parent_id``,
        ``depth``, ``num_tokens``, ``first_tokens``, ``lock_ref``, ``evictable``,
        ``last_access_time``, ``hit_count``, ``extra_key``, ``priority``,
        ``creation_time`` (see :func:`~kvlab.engines.sglang.tree_node.tree_frame`)."""
        return tree_frame(self.root)

    def match_prefix(self, key: RadixKey | Sequence[int]) -> MatchResult:
        """The longest cached prefix of ``key``, in whole pages.

        Models SGLang ``RadixCache.match_prefix`` / ``_match_prefix_helper`` (rule S2):
        the key is cut to a page multiple (a key shorter than a page matches nothing and
        touches nothing); every visited node, the root included, gets
        ``last_access_time = now``; when the match ends inside a node, that node is
        split there (the upper half copies ``lock_ref``, ``hit_count`` and ``priority``)
        and the upper half is ``last_node``. Only the key's namespace is searched (S1).

        Raises:
            ValueError: ``key`` neither a :class:`RadixKey` nor a token sequence, or a
                token id ``>= 2**63`` (nothing changes).
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
        to a page multiple; the clock ticks and the root gets ``last_access_time = now``
        and ``priority = max(root's, priority)``; every walked node gets the same, plus
        ``hit_count += 1`` unless ``chunked``; a partial match splits; the rest becomes a
        new leaf (``hit_count`` 1, or 0 when chunked). A key shorter than a page (or
        empty) adds no node and returns 0, but — as upstream, whose helper stamps the
        root before it looks at the key — still ticks the clock and stamps the root.
        The caller still owns ``value[:returned]`` (duplicates of cached slots) and the
        unaligned tail; :meth:`cache_finished_req` frees them.

        Args:
            key: the tokens (and namespace).
            value: ``int[len(key)]`` KV slots of those tokens; ``None`` means the token
                ids themselves (only without a KV pool). With a pool, the slots for the
                tokens new to the tree must be the caller's own: allocated, not held by
                the tree (the matched part may repeat the tree's slots).
            priority: request priority (any int; higher survives ``priority`` eviction).
            chunked: a chunked-prefill step (no hit counting).

        Raises:
            ValueError: a bad key (a token id ``>= 2**63`` included), priority or flag;
                ``value`` missing while the cache has a KV pool, of another length than
                ``key``, holding repeated slots or slots not allocated from the pool, or
                giving the new part of the key slots the tree already holds (names
                them). Nothing changes then, not even the clock.

        Example:
            >>> cache = RadixCache(page_size=4)
            >>> cache.insert([1, 2, 3], priority=5), cache.total_size(), cache.clock
            (0, 0, 1)
            >>> cache.root.last_access_time, cache.root.priority
            (1, 5)
        """
        key = as_radix_key(key)
        value = check_insert_value(key.token_ids, value, self.allocator)
        priority = check_int("priority", priority)
        check_flag("chunked", chunked)
        key = key.page_aligned(self.page_size)
        value = value[:len(key)]
        if self.tree_slots is not None:
            self.tree_slots.check_new("value", value[matched_len(self.root, key, self.page_size):])
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
            if self.tree_slots is not None:
                self.tree_slots.adopt(value)
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
            ValueError: a bad ``key`` (a token id ``>= 2**63`` included);
                ``kv_indices`` of the wrong length, not allocated, or whose slots after
                the matched prefix (the request's own) are held by the tree; a
                ``last_node`` not in this tree, not locked (never locked, or the request
                already finished), of another namespace, or whose path is not the start
                of ``key`` / ``kv_indices``. Nothing changes then.
            RuntimeError: ``last_node`` is locked but an ancestor is not (a bug).
        """
        key = as_radix_key(key)
        path = path_to_root(self.root, last_node, "last_node")
        check_unlockable(path, "last_node")
        kv = check_slots("kv_indices", kv_indices, self.allocator)
        protected_len = check_finished_request(key, kv, path)
        if self.tree_slots is not None:
            self.tree_slots.check_new("kv_indices", kv[protected_len:])
        new_prefix_len = self.insert(key[:len(kv)], kv, priority)
        aligned_len = len(kv) // self.page_size * self.page_size
        released = np.concatenate([kv[protected_len:new_prefix_len], kv[aligned_len:]])
        if self.allocator is not None:
            self.allocator.free(released)  # the request's own slots, checked above
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
        for n in path_to_root(self.root, node, "node"):
            if n.lock_ref == 0:
                moved += len(n.key)
                self._shift_to_protected(len(n.key))
            n.lock_ref += 1
            self._update_leaf_status(n)
        return moved

    def dec_lock_ref(self, node: TreeNode) -> int:
        """Undo one :meth:`inc_lock_ref`. Models SGLang ``RadixCache.dec_lock_ref`` (S6).

        The root's lock is permanent: as upstream, whose walk stops at the root, locking
        or unlocking the root (a request that matched nothing) changes nothing.

        Returns:
            Tokens moved from protected back to evictable.

        Raises:
            ValueError: ``node`` is not in this tree, or is not locked (an unlock without
                a lock); nothing changes then.
            RuntimeError: ``node`` is locked but an ancestor is not (a bug; nothing
                changes).
        """
        path = path_to_root(self.root, node, "node")
        check_unlockable(path, "node")
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
        (unlocked, childless), built once from ``(strategy score, last_access_time,
        node_id)``; pop, free the slots, delete the node; a parent left unlocked and
        childless is pushed; stop once ``num_tokens`` are freed. Whole nodes only, so
        the result can exceed ``num_tokens``; it is smaller only when nothing else is
        evictable. The victims are planned and their slots checked first, so an
        eviction never stops half-way.

        Returns:
            Tokens freed.

        Raises:
            ValueError: ``num_tokens`` not an integer >= 0.
            RuntimeError: a victim's slot is repeated, not held by the tree or already
                free (the tree is corrupt, a bug); nothing changes then.
        """
        num_tokens = check_count("num_tokens", num_tokens)
        victims = plan_eviction(self._evictable_leaves.values(), num_tokens, self._heap_entry)
        self._free(np.concatenate([n.value for n in victims]) if victims else _EMPTY, "evict")
        for node in victims:
            self._delete_leaf(node)
            self._events.record_remove(node)
        return sum(len(n.value) for n in victims)

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

        Raises:
            RuntimeError: a slot of the tree is repeated, not held by it or already free
                (a bug); nothing changes then.
        """
        if self._protected:
            return False
        self._free(np.concatenate([node.value for node, _ in iter_tree(self.root)]), "reset")
        self._new_tree()
        return True

    def __repr__(self) -> str:
        return (f"RadixCache(page_size={self.page_size}, eviction_policy={self.eviction_strategy.name!r}, "
                f"tokens={self.total_size()}, evictable={self._evictable}, protected={self._protected})")

    # ----- internals ----------------------------------------------------------------

    def _heap_entry(self, node: TreeNode) -> tuple:
        return (self.eviction_strategy.get_priority(node), node.last_access_time, node.node_id, node)

    def _free(self, slots: np.ndarray, operation: str) -> None:
        """Return tree slots to the pool, all checked before any is freed (RuntimeError)."""
        if self.tree_slots is not None:
            self.tree_slots.release(slots, operation)

    def _new_tree(self) -> None:
        self.root = self._new_node(ROOT_PRIORITY)
        self.root.lock_ref = 1
        self.root.hash_value, self.root.block_ids = [], []
        self._evictable = self._protected = 0
        self._evictable_leaves: dict[int, TreeNode] = {}
        self._events.record_all_cleared()

    def _tick(self) -> int:
        self.clock += 1
        return self.clock

    def _new_node(self, priority: int) -> TreeNode:
        node = TreeNode(self._next_id, self.clock, priority)
        self._next_id += 1
        return node

    def _add_leaf(self, parent: TreeNode, key: RadixKey, value: np.ndarray, priority: int, hits: int) -> None:
        leaf = self._new_node(priority)
        leaf.parent, leaf.key, leaf.value, leaf.hit_count = parent, key, value, hits
        parent.children[key.child_key(self.page_size)] = leaf
        self._evictable += len(key)
        self._update_leaf_status(parent)
        self._update_leaf_status(leaf)
        self._events.hash_node(leaf)
        self._events.record_store(leaf)

    def _split_node(self, child: TreeNode, split_len: int) -> TreeNode:
        """Models SGLang ``_split_node``: ``parent → child`` becomes ``parent → upper →
        child`` at ``split_len`` tokens (a page multiple); returns ``upper``."""
        if self.split_events:
            self._events.record_remove(child)
        upper = self._new_node(child.priority)
        upper.lock_ref, upper.hit_count, upper.parent = child.lock_ref, child.hit_count, child.parent
        upper.key, upper.value = child.key[:split_len], child.value[:split_len]
        child.key, child.value, child.parent = child.key[split_len:], child.value[split_len:], upper
        if child.hash_value is not None:
            pages = split_len // self.page_size
            upper.hash_value, child.hash_value = child.hash_value[:pages], child.hash_value[pages:]
            upper.block_ids, child.block_ids = child.block_ids[:pages], child.block_ids[pages:]
        upper.parent.children[upper.key.child_key(self.page_size)] = upper
        upper.children[child.key.child_key(self.page_size)] = child
        if self.split_events:
            self._events.record_store(upper)
            self._events.record_store(child)
        return upper

    def _delete_leaf(self, node: TreeNode) -> None:
        del node.parent.children[node.key.child_key(self.page_size)]
        self._evictable -= len(node.key)
        self._evictable_leaves.pop(node.node_id, None)
        self._update_leaf_status(node.parent)
        node.parent = None

    def _update_leaf_status(self, node: TreeNode) -> None:
        """Keep ``_evictable_leaves`` = unlocked childless non-root nodes (SGLang's
        ``evictable_leaves``), so eviction never walks the tree."""
        if node.lock_ref == 0 and not node.children and node is not self.root:
            self._evictable_leaves[node.node_id] = node
        else:
            self._evictable_leaves.pop(node.node_id, None)

    def _shift_to_protected(self, num_tokens: int) -> None:
        """Move ``num_tokens`` (negative: back) from evictable to protected."""
        self._evictable -= num_tokens
        self._protected += num_tokens
