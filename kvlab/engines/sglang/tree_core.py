"""The radix tree under SGLang's RadixCache: its clock, nodes, splits, locks and counters.

Models the tree half of ``sgl-project/sglang : python/sglang/srt/mem_cache/radix_cache.py``
(SGLang 0.5.23: ``TreeNode`` creation, ``_split_node``, the leaf ``_insert_helper`` adds,
``_delete_leaf``, ``_update_leaf_status``, ``inc_lock_ref`` / ``dec_lock_ref`` and the
``evictable_size_`` / ``protected_size_`` counters), split from the cache as upstream
splits its ``UnifiedRadixCache`` from ``unified_cache/unified_tree_core.py`` — whose
T-LRU node depths it keeps too, when the cache evicts with ``"tlru"``.

**Clock.** SGLang stamps nodes with ``time.monotonic()``; kvlab counts one tick per
reading, so ticks order nodes exactly as upstream's clock does (docs/specs/engines.md S1):

* each ``match_prefix`` / ``insert`` reads it once and stamps the root and every node
  it walks with that tick;
* every new node reads it again at creation (``last_access_time = creation_time``): the
  upper half of a split and a new leaf are stamped *after* the walk, in creation order.

So ``insert([1, 2]); insert([1, 3])`` leaves ``[2]`` at the walk's tick, the split-off
``[1]`` one later and the new leaf ``[3]`` last: MRU evicts ``[3]``. Node ids come from a
per-instance counter; eviction ties (same score, same tick) go to the lower id.

**T-LRU depths** (``eviction_policy="tlru"`` only; 0 otherwise, as upstream): a new leaf's
``tlru_cached_prefix_len`` is its parent's plus its length, and every ancestor whose
``tlru_history_len`` is lower is raised to it; a split's upper half sits at the parent's
depth plus the split length and inherits the branch's ``tlru_history_len``.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from kvlab.engines.sglang.checks import TreeSlots, check_unlockable, path_to_root
from kvlab.engines.sglang.events import RadixEventRecorder
from kvlab.engines.sglang.evict_policy import EvictionStrategy
from kvlab.engines.sglang.tree_node import RadixKey, TreeNode, iter_tree, tree_frame, tree_text

#: The root's priority: SGLang's ``-sys.maxsize`` (any real priority overrides it).
ROOT_PRIORITY = -(2**63 - 1)


class RadixTreeCore:
    """A radix tree with SGLang's node bookkeeping; the base of
    :class:`~kvlab.engines.sglang.radix_cache.RadixCache`, which walks it.

    Keeps, without ever walking the tree: ``evictable + protected == tokens in the tree``,
    ``protected`` = tokens of nodes with ``lock_ref > 0`` (the root holds 1 and no tokens),
    and the evictable leaves (unlocked, childless, non-root).

    Args:
        page_size: tokens per page (>= 1, checked by the caller).
        eviction_strategy: the strategy; ``"tlru"`` turns on the T-LRU depths.
        events: the KV event recorder.
        tree_slots: the record of the slots the tree holds, or ``None`` without a pool.
        split_events: publish remove + store on a split (mid-2025 SGLang).

    Attributes:
        root: the root node (``lock_ref`` 1, no tokens); replaced by a reset.
        clock: the logical clock (module docstring).

    Example:
        >>> from kvlab.engines.sglang.evict_policy import get_eviction_strategy
        >>> core = RadixTreeCore(1, get_eviction_strategy("lru"), RadixEventRecorder(enabled=False, page_size=1))
        >>> core.root.node_id, core.root.lock_ref, core.clock
        (0, 1, 1)
    """

    def __init__(self, page_size: int, eviction_strategy: EvictionStrategy, events: RadixEventRecorder,
                 tree_slots: TreeSlots | None = None, split_events: bool = False) -> None:
        self.page_size = page_size
        self.eviction_strategy = eviction_strategy
        self.tree_slots = tree_slots
        self.split_events = split_events
        self._events = events
        self._tlru = eviction_strategy.name == "tlru"
        self.clock = 0
        self._next_id = 0
        self._new_tree()

    def evictable_size(self) -> int:
        """Tokens in unlocked nodes (SGLang ``evictable_size``)."""
        return self._evictable

    def protected_size(self) -> int:
        """Tokens in locked nodes (SGLang ``protected_size``)."""
        return self._protected

    def total_size(self) -> int:
        """Tokens in the tree, counted by a walk (SGLang ``total_size``)."""
        return sum(len(node.key) for node, _ in iter_tree(self.root))

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
            ValueError: ``node`` is not in this tree (SGLang fails an assertion then), or is
                not locked (an unlock without a lock); nothing changes then.
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

    # ----- internals ----------------------------------------------------------------

    def _tick(self) -> int:
        """One reading of the clock (SGLang ``time.monotonic()``)."""
        self.clock += 1
        return self.clock

    def _new_node(self, priority: int) -> TreeNode:
        """A node stamped with a fresh tick (SGLang ``TreeNode()`` reads the clock)."""
        node = TreeNode(self._next_id, self._tick(), priority)
        self._next_id += 1
        return node

    def _new_tree(self) -> None:
        self.root = self._new_node(ROOT_PRIORITY)
        self.root.lock_ref = 1
        self.root.hash_value = []
        self._evictable = self._protected = 0
        self._evictable_leaves: dict[int, TreeNode] = {}
        self._events.record_all_cleared()

    def _add_leaf(self, parent: TreeNode, key: RadixKey, value: np.ndarray, priority: int, hits: int) -> None:
        leaf = self._new_node(priority)
        leaf.parent, leaf.key, leaf.value, leaf.hit_count = parent, key, value, hits
        parent.children[key.child_key(self.page_size)] = leaf
        if self._tlru:
            depth = leaf.tlru_cached_prefix_len = parent.tlru_cached_prefix_len + len(key)
            leaf.tlru_history_len = depth
            node = parent
            while node is not None and node.tlru_history_len < depth:
                node.tlru_history_len = depth
                node = node.parent
        self._evictable += len(key)
        self._update_leaf_status(parent)
        self._update_leaf_status(leaf)
        self._events.hash_node(leaf)
        self._events.record_store(leaf)

    def _split_node(self, child: TreeNode, split_len: int) -> TreeNode:
        """Models SGLang ``_split_node``: ``parent → child`` becomes ``parent → upper →
        child`` at ``split_len`` tokens (a page multiple); returns ``upper``, a new node
        (fresh tick) copying the child's ``lock_ref``, ``hit_count`` and ``priority``."""
        if self.split_events:
            self._events.record_remove(child)
        upper = self._new_node(child.priority)
        upper.lock_ref, upper.hit_count, upper.parent = child.lock_ref, child.hit_count, child.parent
        upper.key, upper.value = child.key[:split_len], child.value[:split_len]
        child.key, child.value, child.parent = child.key[split_len:], child.value[split_len:], upper
        if self._tlru:
            upper.tlru_cached_prefix_len = upper.parent.tlru_cached_prefix_len + split_len
            upper.tlru_history_len = child.tlru_history_len
        if child.hash_value is not None:
            pages = split_len // self.page_size
            upper.hash_value, child.hash_value = child.hash_value[:pages], child.hash_value[pages:]
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

    def _heap_entry(self, node: TreeNode) -> tuple:
        return (self.eviction_strategy.get_priority(node), node.last_access_time, node.node_id, node)

    def _free(self, slots: np.ndarray, operation: str) -> None:
        """Return tree slots to the pool, all checked before any is freed (RuntimeError)."""
        if self.tree_slots is not None:
            self.tree_slots.release(slots, operation)
