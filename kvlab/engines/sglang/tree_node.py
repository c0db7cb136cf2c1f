"""SGLang's radix tree data: a namespaced token key, a tree node, and views of a tree.

Models ``sgl-project/sglang : python/sglang/srt/mem_cache/radix_cache.py ::
RadixKey, TreeNode`` (SGLang 0.5.x, docs/specs/engines.md §2.1 rule S1). Upstream keeps
them in ``radix_cache.py``; kvlab keeps them here, so that the cache, the allocator checks,
the event recorder and the eviction strategies import them without a circle. A node's key
is a token span; children are keyed by their first token (``page_size == 1``) or first
page as a tuple, prefixed by the namespace (``extra_key``) when there is one, so keys of
different namespaces never share a child slot::

    page_size 1:  root ─┬─ 1 ─────────────► [1 2 3 4]
                        └─ ("lora-a", 1) ──► [1 2 3]            (namespace "lora-a")
    page_size 4:  root ─── (1, 2, 3, 4) ──► [1 2 3 4 5 6 7 8]

Times are *logical*: ticks of the owning cache's clock, never wall time (one tick per
reading of SGLang's ``time.monotonic()``: :mod:`kvlab.engines.sglang.tree_core`). The views
(:func:`tree_text`, :func:`tree_frame`) are SGLang's ``pretty_print`` with kvlab's fields
and the one-row-per-node frame notebook tables and tree charts read::

    root #0 r=1
      [1 2 3 4] #2 r=1 hit=2 t=7      key preview, node id, lock_ref, hit_count,
        [5 6 7 8] #1 r=0 hit=1 t=4    last access tick; children indented
        [9 10 11 12] #3 r=1 hit=1 t=7
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from kvlab.hashing.base import as_token_array

#: The key of a child edge: a token, a page tuple, or ``(extra_key, token-or-page)``.
ChildKey = int | tuple


def preview_tokens(tokens: Sequence[int], limit: int = 6) -> str:
    """A short text preview of a token span.

    Example:
        >>> preview_tokens(range(1, 9)), preview_tokens([])
        ('[1 2 3 4 5 6 …]', '[]')
    """
    shown = " ".join(str(t) for t in tokens[:limit])
    return f"[{shown}{' …' if len(tokens) > limit else ''}]"


@dataclass(frozen=True)
class RadixKey:
    """Token ids plus an optional namespace; the key of one radix-tree edge or lookup.

    Models SGLang ``RadixKey`` (rule S1): two keys of different ``extra_key`` never
    match, and comparing them raises. Slicing keeps the namespace.

    Attributes:
        token_ids: the tokens, as a tuple of Python ints (``0 <= t < 2**64``).
        extra_key: the namespace (a LoRA adapter name, a cache salt …), ``None`` for
            the shared namespace. kvlab's ``lora_name`` is SGLang's ``extra_key``.

    Raises:
        ValueError: token ids that are not non-negative integers, or an ``extra_key``
            that is not a non-empty string or None.

    Example:
        >>> key = RadixKey([1, 2, 3, 4, 5], extra_key="lora-a")
        >>> key[:4], key.child_key(page_size=4)
        (RadixKey(extra_key='lora-a', token_ids=[1 2 3 4]), ('lora-a', (1, 2, 3, 4)))
        >>> key.match(RadixKey([1, 2, 3, 9], "lora-a"), page_size=1)
        3
    """

    token_ids: tuple[int, ...]
    extra_key: str | None = None

    def __post_init__(self) -> None:
        tokens = tuple(int(t) for t in as_token_array(self.token_ids))
        object.__setattr__(self, "token_ids", tokens)
        if self.extra_key is not None and (not isinstance(self.extra_key, str) or not self.extra_key):
            raise ValueError(f"extra_key must be a non-empty string or None, got {self.extra_key!r}")

    @classmethod
    def _trusted(cls, token_ids: tuple[int, ...], extra_key: str | None) -> RadixKey:
        """A key from already-checked parts (slicing must not re-validate every token)."""
        key = object.__new__(cls)
        object.__setattr__(key, "token_ids", token_ids)
        object.__setattr__(key, "extra_key", extra_key)
        return key

    def __len__(self) -> int:
        return len(self.token_ids)

    def __getitem__(self, index: slice) -> RadixKey:
        """A sub-span in the same namespace.

        Raises:
            ValueError: ``index`` is not a slice with step 1.
        """
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise ValueError(f"index must be a slice with step 1, got {index!r}")
        return RadixKey._trusted(self.token_ids[index], self.extra_key)

    def __repr__(self) -> str:
        return f"RadixKey(extra_key={self.extra_key!r}, token_ids={preview_tokens(self.token_ids)})"

    def page_aligned(self, page_size: int) -> RadixKey:
        """The key cut to a multiple of ``page_size`` tokens (``len // page * page``).

        Models SGLang ``RadixKey.page_aligned`` (rule S2)."""
        return self[:len(self) // page_size * page_size]

    def match(self, other: RadixKey, page_size: int = 1) -> int:
        """Length of the common prefix with ``other``, in whole pages (a page counts only
        if all its tokens match).

        Models SGLang ``RadixKey.match`` / ``_key_match_paged`` (rules S1, S2).

        Raises:
            ValueError: the two keys have different ``extra_key`` namespaces.
        """
        if self.extra_key != other.extra_key:
            raise ValueError(f"keys of different namespaces cannot be compared: extra_key {self.extra_key!r} "
                             f"vs {other.extra_key!r}")
        a, b = self.token_ids, other.token_ids
        n, limit = 0, min(len(a), len(b))
        while n < limit and a[n] == b[n]:
            n += 1
        return n // page_size * page_size

    def child_key(self, page_size: int) -> ChildKey:
        """The dict key of the edge this key starts: first token or first page, prefixed
        by the namespace. Models SGLang ``RadixKey.child_key`` / ``get_child_key``."""
        plain = self.token_ids[0] if page_size == 1 else self.token_ids[:page_size]
        return plain if self.extra_key is None else (self.extra_key, plain)


class TreeNode:
    """One node of SGLang's radix tree: a token span and the KV slots that hold it.

    Models SGLang ``TreeNode`` (rule S1) with kvlab's determinism: ``node_id`` comes
    from the owning cache's per-instance counter and times are logical clock ticks.
    Nodes are created and mutated only by :class:`~kvlab.engines.sglang.radix_cache.RadixCache`.

    Attributes:
        node_id: id unique within the owning cache (the root included).
        children: child nodes by :meth:`RadixKey.child_key` of their key.
        parent: the parent node, ``None`` for the root and for removed nodes.
        key: the token span of the edge into this node (empty for the root).
        value: ``int64[len(key)]`` KV slot indices of those tokens.
        lock_ref: running requests whose matched path passes through this node (the
            root holds 1 forever).
        last_access_time: clock tick of the last match or insert that visited it.
        creation_time: clock tick of its creation (a split's upper half is new).
        hit_count: inserts that created it or walked through it (chunked steps not
            counted).
        priority: the highest request priority that inserted through it.
        hash_value: SGLang event-chain page hashes (hex), one per page, when the cache
            publishes KV events; else ``None``.
        tlru_cached_prefix_len: tokens from the root through this node (T-LRU's depth;
            0 unless the cache evicts with ``"tlru"``).
        tlru_history_len: the deepest ``tlru_cached_prefix_len`` its branch ever reached
            (T-LRU's conversation length L; it does not shrink when the tail is evicted).

    Example:
        >>> node = TreeNode(node_id=7, now=3)
        >>> node.lock_ref, node.last_access_time, node.creation_time, node.hit_count
        (0, 3, 3, 0)
    """

    __slots__ = ("node_id", "children", "parent", "key", "value", "lock_ref", "last_access_time",
                 "creation_time", "hit_count", "priority", "hash_value", "tlru_cached_prefix_len",
                 "tlru_history_len")

    def __init__(self, node_id: int, now: int, priority: int = 0) -> None:
        self.node_id = node_id
        self.children: dict[ChildKey, TreeNode] = {}
        self.parent: TreeNode | None = None
        self.key = RadixKey._trusted((), None)
        self.value = np.zeros(0, dtype=np.int64)
        self.lock_ref = 0
        self.last_access_time = now
        self.creation_time = now
        self.hit_count = 0
        self.priority = priority
        self.hash_value: list[str] | None = None
        self.tlru_cached_prefix_len = 0
        self.tlru_history_len = 0

    def __repr__(self) -> str:
        ns = "" if self.key.extra_key is None else f"{self.key.extra_key}:"
        return (f"TreeNode(id={self.node_id}, key={ns}{preview_tokens(self.key.token_ids)}, "
                f"lock_ref={self.lock_ref}, hit_count={self.hit_count})")


#: The largest token id the cache takes: SGLang token ids are int64 (its ``insert``
#: without a value stores the ids themselves in an int64 tensor).
MAX_TOKEN_ID = 2**63 - 1


def as_radix_key(key: RadixKey | Sequence[int] | np.ndarray) -> RadixKey:
    """``key`` itself, or a token sequence as a key of the shared namespace, checked for
    the cache: token ids must fit int64 (``< 2**63``), as SGLang's do. A bare
    :class:`RadixKey` takes ids up to ``2**64 - 1`` (the hashers do); the cache does not.

    Raises:
        ValueError: neither a :class:`RadixKey` nor a sequence of token ids, or a token
            id of ``2**63`` or more (names it).

    Example:
        >>> as_radix_key([1, 2])
        RadixKey(extra_key=None, token_ids=[1 2])
        >>> as_radix_key([2**63])
        Traceback (most recent call last):
        ValueError: key token ids must be < 2**63 (SGLang token ids are int64), got 9223372036854775808
    """
    if not isinstance(key, RadixKey):
        if isinstance(key, (str, bytes)) or not isinstance(key, (Sequence, np.ndarray)):
            raise ValueError(f"key must be a RadixKey or a sequence of token ids, got {key!r}")
        key = RadixKey(key)
    too_big = next((t for t in key.token_ids if t > MAX_TOKEN_ID), None)
    if too_big is not None:
        raise ValueError(f"key token ids must be < 2**63 (SGLang token ids are int64), got {too_big}")
    return key


#: Column types of :func:`tree_frame`.
TREE_SCHEMA = {"node_id": pl.Int64, "parent_id": pl.Int64, "depth": pl.Int64, "num_tokens": pl.Int64,
               "first_tokens": pl.String, "lock_ref": pl.Int64, "evictable": pl.Boolean,
               "last_access_time": pl.Int64, "hit_count": pl.Int64, "extra_key": pl.String,
               "priority": pl.Int64, "creation_time": pl.Int64}


def iter_tree(root: TreeNode) -> Iterator[tuple[TreeNode, int]]:
    """Every node under ``root`` (itself first) with its depth in edges, depth-first,
    children in insertion order (a split keeps its node's place).

    Example:
        >>> [(n.node_id, d) for n, d in iter_tree(TreeNode(node_id=0, now=0))]
        [(0, 0)]
    """
    stack = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        yield node, depth
        stack.extend((child, depth + 1) for child in reversed(list(node.children.values())))


def _label(node: TreeNode) -> str:
    namespace = "" if node.key.extra_key is None else f"{node.key.extra_key}:"
    return f"{namespace}{preview_tokens(node.key.token_ids)}"


def tree_text(root: TreeNode) -> str:
    """The tree as text, one node per line (see the module docstring).

    Example:
        >>> tree_text(TreeNode(node_id=0, now=0))
        'root #0 r=0'
    """
    lines = []
    for node, depth in iter_tree(root):
        if depth == 0:
            lines.append(f"root #{node.node_id} r={node.lock_ref}")
        else:
            lines.append(f"{'  ' * depth}{_label(node)} #{node.node_id} r={node.lock_ref} hit={node.hit_count} "
                         f"t={node.last_access_time}")
    return "\n".join(lines)


def tree_frame(root: TreeNode) -> pl.DataFrame:
    """One row per node, ``root`` first, depth-first.

    Columns (:data:`TREE_SCHEMA`): ``node_id``; ``parent_id`` (null for the root);
    ``depth`` (edges from the root); ``num_tokens``; ``first_tokens`` (a short preview,
    ``"[1 2 3 4 5 6 …]"``, prefixed ``"ns:"`` in a namespace); ``lock_ref``;
    ``evictable`` (an eviction candidate now: an unlocked leaf, SGLang's
    ``evictable_leaves``; inner unlocked nodes become candidates once their children go);
    ``last_access_time`` and ``creation_time`` (clock ticks); ``hit_count``;
    ``extra_key`` (null for the shared namespace); ``priority``.

    Example:
        >>> tree_frame(TreeNode(node_id=0, now=0)).select("node_id", "parent_id", "num_tokens").row(0)
        (0, None, 0)
    """
    rows = [{"node_id": n.node_id, "parent_id": None if depth == 0 else n.parent.node_id, "depth": depth,
             "num_tokens": len(n.key), "first_tokens": _label(n), "lock_ref": n.lock_ref,
             "evictable": depth > 0 and n.lock_ref == 0 and not n.children, "last_access_time": n.last_access_time,
             "hit_count": n.hit_count, "extra_key": n.key.extra_key, "priority": n.priority,
             "creation_time": n.creation_time} for n, depth in iter_tree(root)]
    return pl.DataFrame(rows, schema=TREE_SCHEMA)


def matched_len(root: TreeNode, key: RadixKey, page_size: int) -> int:
    """Tokens of the page-aligned ``key`` already in the tree under ``root``; changes
    nothing (no split, no stamp), so an insert can check its new part before it mutates.

    Example:
        >>> matched_len(TreeNode(node_id=0, now=0), RadixKey([1, 2]), page_size=1)
        0
    """
    node, total = root, 0
    while len(key) and (child := node.children.get(key.child_key(page_size))) is not None:
        matched = child.key.match(key, page_size)
        total += matched
        if matched < len(child.key):
            break
        node, key = child, key[matched:]
    return total


def plan_eviction(leaves: Iterable[TreeNode], num_tokens: int, entry: Callable[[TreeNode], tuple]) -> list[TreeNode]:
    """The nodes an eviction of ``num_tokens`` removes, in order; changes nothing.

    SGLang's loop (``RadixCache.evict``, rule S7): a min-heap of the evictable ``leaves``
    by ``entry(node)`` (a tuple ending with the node); pop one, and push its parent once
    the parent is unlocked and all its children are popped; stop once ``num_tokens`` are
    covered.

    Example:
        >>> plan_eviction([], 4, lambda n: (n.last_access_time, n.node_id, n))
        []
    """
    heap = [entry(n) for n in leaves]
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
