"""The radix tree's bookkeeping: nodes, splits, lock counters, evictable leaves, events.

:class:`RadixTreeBase` keeps the invariants SGLang's ``RadixCache`` maintains
incrementally (``sgl-project/sglang : python/sglang/srt/mem_cache/radix_cache.py``,
docs/specs/engines.md §2.1); :class:`~kvlab.engines.sglang.radix_cache.RadixCache` builds the
algorithms (match, insert, lock, evict, request caching) on it::

    evictable_size + protected_size == tokens in the tree
    protected  = tokens of nodes with lock_ref > 0      (the root: lock_ref 1, no tokens)
    evictable leaves = unlocked, childless, non-root nodes  (eviction never walks the tree)

Determinism: node ids come from a per-instance counter and every node is stamped with
the logical :attr:`~RadixTreeBase.clock` (a tick per match or insert), never wall time.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import numpy as np
import polars as pl

from kvlab.engines.sglang.events import RadixEventRecorder
from kvlab.engines.sglang.tree_node import RadixKey, TreeNode
from kvlab.engines.sglang.radix_view import iter_tree, tree_frame, tree_text
from kvlab.events.types import KVEvent
from kvlab.hashing.base import check_block_size

#: The root's priority: SGLang's ``-sys.maxsize`` (any real priority overrides it).
ROOT_PRIORITY = -(2**63 - 1)


def check_bool(name: str, value: object) -> bool:
    """``value`` if it is a bool.

    Raises:
        ValueError: not a bool; names ``name``.
    """
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r}")
    return value


def check_priority(priority: object) -> int:
    """``priority`` as an ``int`` (any integer; bools refused).

    Raises:
        ValueError: not an integer; names ``priority``.
    """
    if isinstance(priority, bool) or not isinstance(priority, (int, np.integer)):
        raise ValueError(f"priority must be an integer, got {priority!r}")
    return int(priority)


class RadixTreeBase:
    """A radix tree with SGLang's bookkeeping; the algorithms live in the subclass.

    Subclassed by :class:`~kvlab.engines.sglang.radix_cache.RadixCache`; holds the root, the
    logical clock, the token counters, the evictable-leaf set and the KV event
    recorder, plus the read-only helpers the cache checks with before it mutates (a
    non-stamping prefix walk, the eviction plan, the unlock check).

    Args:
        page_size: tokens per page (>= 1).
        enable_kv_cache_events: record KV events for :meth:`take_events`.
        split_events: publish remove + store events on a node split (mid-2025 SGLang).

    Attributes:
        root: the root node (``lock_ref`` 1, no tokens); replaced by a reset.
        clock: the logical clock, ticked once per ``match_prefix`` / ``insert``.

    Raises:
        ValueError: a bad argument (names it and its value).

    Example:
        >>> tree = RadixTreeBase(page_size=4)
        >>> tree.total_size(), tree.root.lock_ref, tree.clock
        (0, 1, 0)
    """

    def __init__(self, page_size: int = 1, enable_kv_cache_events: bool = False, split_events: bool = False) -> None:
        self.page_size = check_block_size(page_size, "page_size")
        self.enable_kv_cache_events = check_bool("enable_kv_cache_events", enable_kv_cache_events)
        self.split_events = check_bool("split_events", split_events)
        self._events = RadixEventRecorder(enabled=self.enable_kv_cache_events, page_size=self.page_size)
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

    def take_events(self) -> list[KVEvent]:
        """The KV events recorded since the last call, oldest first; clears the queue.

        Models SGLang ``RadixCache.take_events``; always ``[]`` when events are off."""
        return self._events.take()

    def pretty(self) -> str:
        """The tree as text, one node per line (SGLang ``pretty_print``; format in
        :mod:`kvlab.engines.sglang.radix_view`), then the token counts."""
        return (f"{tree_text(self.root)}\n"
                f"tokens {self.total_size()}: evictable {self._evictable}, protected {self._protected}")

    def snapshot(self) -> pl.DataFrame:
        """One row per node, root first, depth-first: ``node_id``, ``parent_id``,
        ``depth``, ``n_tokens``, ``first_tokens``, ``lock_ref``, ``evictable``,
        ``last_access_time``, ``hit_count``, ``extra_key``, ``priority``,
        ``creation_time`` (see :func:`~kvlab.engines.sglang.radix_view.tree_frame`)."""
        return tree_frame(self.root)

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

    def _shift_to_protected(self, n_tokens: int) -> None:
        """Move ``n_tokens`` (negative: back) from evictable to protected."""
        self._evictable -= n_tokens
        self._protected += n_tokens

    def _path_to_root(self, node: object, name: str) -> list[TreeNode]:
        """``node`` and its ancestors below the root, deepest first.

        Raises:
            ValueError: ``node`` is not a node of this tree."""
        path = []
        current = node
        while current is not self.root:
            if not isinstance(current, TreeNode) or current.parent is None:
                raise ValueError(f"{name} must be a node of this cache's tree (not evicted, not from before a "
                                 f"reset, not another cache's), got {node!r}")
            path.append(current)
            current = current.parent
        return path

    @staticmethod
    def _check_unlockable(path: list[TreeNode], name: str) -> None:
        """Refuse an unlock that would drive a lock count below 0 (checked before any change).

        Raises:
            ValueError: ``path[0]`` (the node named ``name``) is not locked — the caller's
                mistake (an unlock without a lock, a request finished twice).
            RuntimeError: ``path[0]`` is locked but an ancestor is not (an ancestor holds
                every lock of its subtree, so this indicates a bug).
        """
        if path and path[0].lock_ref < 1:
            raise ValueError(f"{name} {path[0]!r} is not locked (lock_ref {path[0].lock_ref}): an unlock without a "
                             f"matching inc_lock_ref, or a request finished twice")
        for n in path:
            if n.lock_ref < 1:
                raise RuntimeError(f"unlocking {path[0]!r} would make the lock_ref of node {n.node_id} negative "
                                   f"while the node itself is locked; this indicates a bug")

    def _matched_len(self, key: RadixKey) -> int:
        """Tokens of the page-aligned ``key`` already in the tree; changes nothing (no
        split, no stamp), so an insert can check its new part before it mutates."""
        node, matched_len = self.root, 0
        while len(key) and (child := node.children.get(key.child_key(self.page_size))) is not None:
            matched = child.key.match(key, self.page_size)
            matched_len += matched
            if matched < len(child.key):
                break
            node, key = child, key[matched:]
        return matched_len

    def _plan_eviction(self, num_tokens: int, entry: Callable[[TreeNode], tuple]) -> list[TreeNode]:
        """The nodes an eviction of ``num_tokens`` removes, in order; changes nothing.

        SGLang's loop (rule S7): a min-heap of the evictable leaves by ``entry(node)``
        (ending with the node); pop one, and push its parent once the parent is unlocked
        and all its children are popped; stop once ``num_tokens`` are covered."""
        heap = [entry(n) for n in self._evictable_leaves.values()]
        heapq.heapify(heap)
        victims: list[TreeNode] = []
        children_left: dict[int, int] = {}
        freed = 0
        while freed < num_tokens and heap:
            node = heapq.heappop(heap)[-1]
            victims.append(node)
            freed += len(node.value)
            parent = node.parent
            left = children_left[parent.node_id] = children_left.get(parent.node_id, len(parent.children)) - 1
            if left == 0 and parent.lock_ref == 0:
                heapq.heappush(heap, entry(parent))
        return victims
