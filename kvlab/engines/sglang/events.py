"""KV events of the SGLang radix cache: page ids, ``BlockStored`` / ``BlockRemoved``.

Models ``sgl-project/sglang : python/sglang/srt/mem_cache/events.py ::
KVCacheEventRecorder`` and ``radix_cache.py :: _record_store_event /
_record_remove_event`` (SGLang 0.5.x, docs/specs/engines.md §2.1 rule S9,
docs/specs/hashing.md §5). A node's pages are hashed on the *event chain*: the prior
of its first page is its parent's last page hash (``compute_node_hash_values``), none
under the root; ids are the hasher's published int64s (``extra_key`` namespaces them
as a LoRA name)::

    root ── A [1 2 3 4 | 5 6 7 8] ── B [9 10 11 12]
    ids       a0        a1 = H(a0, ·)     b0 = H(a1, ·)
    events    Stored(a0, parent None) Stored(a1, parent a0) Stored(b0, parent a1)

The radix cache publishes ``BlockStored`` per page of a new leaf, ``BlockRemoved`` per
evicted node and ``AllBlocksCleared`` on reset and at construction (SGLang's ``__init__``
calls ``reset``). By default a split emits **no** events, as in current SGLang (PRs
#13488, #14934: chained page ids survive a split); docs/specs/engines.md S9 describes the
mid-2025 behaviour — remove(old node) + store(both halves) — which the cache's
``split_events=True`` restores. SGLang's 2026 recorder coalesces consecutive compatible
events into one; this one records them uncoalesced (one ``BlockStored`` per page, one
``BlockRemoved`` per node), which an index applies to the same state.
"""

from __future__ import annotations

from kvlab.engines.sglang.tree_node import TreeNode
from kvlab.events.types import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from kvlab.hashing.base import RequestExtras
from kvlab.hashing.sglang_hash import SGLangHasher

MEDIUM_GPU = "GPU"


class RadixEventRecorder:
    """Hashes radix nodes' pages and queues their KV events.

    Models SGLang ``KVCacheEventRecorder`` (without coalescing). With
    ``enabled=False`` every call is a no-op and :meth:`take` returns ``[]``.

    Args:
        enabled: record events (``--kv-events-config`` set).
        page_size: tokens per page (>= 1).

    Raises:
        ValueError: bad ``page_size``.

    Example:
        >>> from kvlab.engines.sglang.tree_node import RadixKey
        >>> rec = RadixEventRecorder(enabled=True, page_size=4)
        >>> root, node = TreeNode(node_id=0, now=0), TreeNode(node_id=1, now=1)
        >>> node.parent, node.key = root, RadixKey([1, 2, 3, 4])
        >>> rec.hash_node(node); rec.record_store(node)
        >>> [(e.block_hashes, e.parent_block_hash, e.token_ids) for e in rec.take()]
        [((-3488128144981237669,), None, (1, 2, 3, 4))]
    """

    def __init__(self, *, enabled: bool, page_size: int) -> None:
        self.enabled = enabled
        self.page_size = page_size
        self._hasher = SGLangHasher(page_size=page_size)
        self._queue: list[KVEvent] = []

    @staticmethod
    def _prior(node: TreeNode) -> str | None:
        """The parent's last page hash; ``None`` under the root (it has no parent)."""
        parent = node.parent
        return None if parent is None or parent.parent is None else parent.hash_value[-1]

    def hash_node(self, node: TreeNode) -> None:
        """Set ``node.hash_value`` (hex event-chain page hashes) and ``node.block_ids``
        (their published int64 ids); the parent must be hashed already.

        Models SGLang ``compute_node_hash_values`` / ``compute_node_event_hash_values``."""
        if not self.enabled:
            return
        key, prior = node.key, self._prior(node)
        extras = None if key.extra_key is None else RequestExtras(lora_name=key.extra_key)
        node.hash_value = self._hasher.event_page_hashes_hex(key.token_ids, extras, prior)
        node.block_ids = self._hasher.event_block_hashes(key.token_ids, extras, prior)

    def record_store(self, node: TreeNode) -> None:
        """One ``BlockStored`` per page of ``node``, chained to the parent's last page."""
        if not self.enabled:
            return
        parent = node.parent
        parent_id = None if parent is None or parent.parent is None else parent.block_ids[-1]
        tokens, size = node.key.token_ids, self.page_size
        for i, block_id in enumerate(node.block_ids):
            page = tokens[i * size:(i + 1) * size]
            self._queue.append(BlockStored(block_hashes=(block_id,), parent_block_hash=parent_id, token_ids=page,
                                           block_size=len(page), lora_id=None, medium=MEDIUM_GPU,
                                           lora_name=node.key.extra_key))
            parent_id = block_id

    def record_remove(self, node: TreeNode) -> None:
        """One ``BlockRemoved`` holding all of ``node``'s page ids."""
        if self.enabled:
            self._queue.append(BlockRemoved(block_hashes=tuple(node.block_ids), medium=MEDIUM_GPU))

    def record_all_cleared(self) -> None:
        """``AllBlocksCleared`` (the whole cache was dropped)."""
        if self.enabled:
            self._queue.append(AllBlocksCleared())

    def take(self) -> list[KVEvent]:
        """The queued events, oldest first; clears the queue."""
        events, self._queue = self._queue, []
        return events
