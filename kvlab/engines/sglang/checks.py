"""Caller checks of the SGLang radix-cache model: what kvlab checks that SGLang trusts.

SGLang's callers (its scheduler) are trusted: a slot inserted twice or freed behind the
tree's back surfaces later as a double free half-way through an eviction. kvlab is driven
by hand, so the cache refuses such input up front, naming the argument, and changes
nothing: the slots of an insert (:func:`check_slots`, :func:`check_insert_value`), the
slots the tree holds (:class:`TreeSlots`), the node a request unlocks
(:func:`path_to_root`, :func:`check_unlockable`). Argument checks (counts, flags) come from
:mod:`kvlab.core.validate`.
"""

from __future__ import annotations

import numpy as np

from kvlab.engines.sglang.allocator import TokenToKVPoolAllocator
from kvlab.engines.sglang.tree_node import RadixKey, TreeNode


class TreeSlots:
    """Which slots of a pool the radix tree holds, so that no slot sits in two nodes.

    SGLang keeps no such record (its callers are trusted); kvlab keeps one bool per slot
    so that a caller's mistake is refused at ``insert`` instead of surfacing later as a
    double free half-way through an eviction. Invariant: a held slot is allocated.

    Args:
        allocator: the pool whose slots are tracked.

    Example:
        >>> pool = TokenToKVPoolAllocator(4)
        >>> held = TreeSlots(pool)
        >>> held.adopt(pool.alloc(2)); held.owned().tolist()
        [1, 2]
        >>> held.check_new("value", np.array([2, 3]))
        Traceback (most recent call last):
        ValueError: value holds slots [2] that the tree already holds for other tokens; ...
        >>> held.release(np.array([2, 1]), "evict"); pool.free_slots().tolist()
        [3, 4, 2, 1]
    """

    def __init__(self, allocator: TokenToKVPoolAllocator) -> None:
        self.allocator = allocator
        self._held = np.zeros(allocator.size + 1, dtype=bool)

    def owned(self) -> np.ndarray:
        """``int64[n]`` the slots the tree holds, ascending."""
        return np.flatnonzero(self._held).astype(np.int64)

    def check_new(self, name: str, slots: np.ndarray) -> None:
        """Refuse slots for tokens new to the tree that it already holds elsewhere
        (``slots`` are checked allocated and in range already, see :func:`check_slots`).

        Raises:
            ValueError: naming ``name`` and the slots already held.
        """
        taken = slots[self._held[slots]]
        if len(taken):
            raise ValueError(f"{name} holds slots {taken.tolist()} that the tree already holds for other tokens; "
                             f"the part of a key new to the tree needs slots of the caller's own (allocated "
                             f"and not cached)")

    def adopt(self, slots: np.ndarray) -> None:
        """Record ``slots`` (checked by :meth:`check_new`) as held by the tree."""
        self._held[slots] = True

    def disown(self, slots: np.ndarray) -> None:
        """Stop holding ``slots`` without freeing them: they stay allocated, the caller's
        (the locked nodes a forced reset drops are still in use by their requests)."""
        self._held[slots] = False

    def release(self, slots: np.ndarray, operation: str) -> None:
        """Free tree slots to the pool, checking all of them before freeing any.

        Raises:
            RuntimeError: a slot repeated, not held by the tree or not allocated (the
                tree is corrupt; ``operation`` names the caller); nothing is freed then.
        """
        allocated = self.allocator.is_allocated(slots)
        if not allocated or len(np.unique(slots)) != len(slots) or not self._held[slots].all():
            raise RuntimeError(f"{operation} would free slots {slots.tolist()} that are repeated or not held by "
                               f"the tree; a slot in two nodes or freed behind the tree's back indicates a bug")
        self._held[slots] = False
        self.allocator.free(slots)


def check_slots(name: str, slots: object, allocator: TokenToKVPoolAllocator | None) -> np.ndarray:
    """``slots`` as ``int64[n]``, checked: non-negative integers and, with a pool,
    distinct slots currently allocated from it.

    Raises:
        ValueError: naming ``name``, the value and the offending slots.

    Example:
        >>> check_slots("value", [3, 4], None).tolist()
        [3, 4]
    """
    arr = np.asarray(slots)
    if arr.ndim != 1 or (arr.size and (arr.dtype.kind not in "iu" or arr.min() < 0)):
        raise ValueError(f"{name} must be a 1-D sequence of non-negative integer slots, got {slots!r}")
    arr = arr.astype(np.int64)
    if allocator is not None:
        unique, counts = np.unique(arr, return_counts=True)
        repeated = unique[counts > 1].tolist()
        missing = unique[~allocator.allocated_mask(unique)].tolist()
        if repeated or missing:
            raise ValueError(f"{name} must hold distinct slots allocated from this cache's pool, got {arr.tolist()} "
                             f"(repeated {repeated}, not allocated {missing})")
    return arr


def check_insert_value(token_ids: tuple[int, ...], value: object,
                       allocator: TokenToKVPoolAllocator | None) -> np.ndarray:
    """An insert's ``value`` as ``int64[len(token_ids)]``: the checked slots, or the token
    ids themselves when ``value`` is ``None`` (allowed only without a pool; the ids fit
    int64, see :func:`~kvlab.engines.sglang.tree_node.as_radix_key`).

    Raises:
        ValueError: ``value`` missing with a pool, of another length, or bad slots
            (see :func:`check_slots`).
    """
    if value is None:
        if allocator is not None:
            raise ValueError("value is required when the cache has a KV pool (kv_pool_size is set); "
                             "allocate slots with cache.allocator.alloc(n)")
        return np.asarray(token_ids, dtype=np.int64)
    arr = check_slots("value", value, allocator)
    if len(arr) != len(token_ids):
        raise ValueError(f"value must hold one slot per token of key ({len(token_ids)}), got {len(arr)}")
    return arr


def path_to_root(root: TreeNode, node: object, name: str) -> list[TreeNode]:
    """``node`` and its ancestors below ``root``, deepest first.

    Raises:
        ValueError: ``node`` (named ``name``) is not a node of the tree under ``root``: evicted,
            from before a reset, another cache's, or not a node.

    Example:
        >>> root, leaf = TreeNode(node_id=0, now=0), TreeNode(node_id=1, now=0)
        >>> leaf.parent = root
        >>> [n.node_id for n in path_to_root(root, leaf, "node")], path_to_root(root, root, "node")
        ([1], [])
    """
    path = []
    current = node
    while current is not root:
        if not isinstance(current, TreeNode) or current.parent is None:
            raise ValueError(f"{name} must be a node of this cache's tree (not evicted, not from before a "
                             f"reset, not another cache's), got {node!r}")
        path.append(current)
        current = current.parent
    return path


def check_unlockable(path: list[TreeNode], name: str) -> None:
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


def check_finished_request(key: RadixKey, kv: np.ndarray, path: list[TreeNode]) -> int:
    """Check a finished request (``RadixCache.cache_finished_req``) against the path of the
    node it locked (``path``, deepest first): ``kv`` holds one slot per token but the last,
    and the path's tokens and slots start ``key`` and ``kv``. Returns the path's length in
    tokens (the request's matched prefix).

    Raises:
        ValueError: an empty key, a wrong number of slots, another namespace, or a path
            that does not start ``key`` / ``kv``.
    """
    if len(key) == 0:
        raise ValueError("key must hold at least one token (the last sampled one has no KV)")
    if len(kv) != len(key) - 1:
        raise ValueError(f"kv_indices must hold len(key) - 1 = {len(key) - 1} slots (the last token has no KV), "
                         f"got {len(kv)}")
    if path and path[0].key.extra_key != key.extra_key:
        raise ValueError(f"last_node is in namespace {path[0].key.extra_key!r}, key in {key.extra_key!r}")
    nodes = path[::-1]
    cached_tokens = tuple(t for n in nodes for t in n.key.token_ids)
    cached_slots = np.concatenate([n.value for n in nodes]) if nodes else np.zeros(0, dtype=np.int64)
    if key.token_ids[:len(cached_tokens)] != cached_tokens or not np.array_equal(kv[:len(cached_tokens)], cached_slots):
        raise ValueError(f"last_node's path ({len(cached_tokens)} tokens) must be the start of key and kv_indices "
                         f"(the request's matched prefix)")
    return len(cached_tokens)
