"""KV events of the SGLang radix cache: page ids, LoRA namespaces, coalesced batches.

Models ``sgl-project/sglang : python/sglang/srt/mem_cache/events.py ::
KVCacheEventRecorder, KvEventLoraNames`` (SGLang 0.5.23, docs/specs/engines.md §2.1 rule
S9, docs/specs/hashing.md §5). A node's pages are hashed on the *event chain*: the prior
of its first page is its parent's last page hash, none under the root; ``extra_key`` is
not mixed in (``compute_node_event_hash_values``). The published id of a page is its
hash's first 8 bytes as an int64 — moved into the namespace
(``namespaced_block_hash``) only when the node's ``extra_key`` belongs to a **registered
LoRA adapter**, which is then also the event's ``lora_name``; any other ``extra_key``
publishes the plain ids and no name::

    root ── A [1 2 3 4 | 5 6 7 8] ── B [9 10 11 12]
    ids       a0        a1 = H(a0, ·)     b0 = H(a1, ·)
    events    Stored(a0 a1, parent None) Stored(b0, parent a1)  → one Stored(a0 a1 b0)

Every event goes through :meth:`RadixEventRecorder.enqueue`, which **coalesces** it into the
queue's last event when compatible, as SGLang does: a ``BlockStored`` continuing the last
stored chain (its parent is the tail's last hash; same medium, block size, LoRA name)
extends it, and consecutive ``BlockRemoved`` of one medium merge. So one node's pages are
one ``BlockStored``, and an eviction's nodes one ``BlockRemoved``, until :meth:`take`.

The radix cache records a store per new leaf, a removal per evicted node and
``AllBlocksCleared`` on reset and at construction (SGLang's ``__init__`` calls ``reset``).
A split publishes nothing, as in current SGLang (chained page ids survive a split); the
cache's ``split_events=True`` restores the mid-2025 remove(old node) + store(both halves)
of docs/specs/engines.md S9. Not modelled: ``cache_salt`` namespaces and Dynamo's event
format (``dynamo_kv_event_format``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from kvlab.core.validate import check_str
from kvlab.engines.sglang.tree_node import TreeNode
from kvlab.events.types import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from kvlab.hashing.sglang_hash import (
    hash_str_to_int64,
    kv_event_namespace_seed,
    namespaced_block_hash,
    sha256_page_chain,
)

MEDIUM_GPU = "GPU"


def check_lora_names(lora_names: Mapping[str, str] | None) -> dict[str, str]:
    """A copy of an ``extra_key → LoRA adapter name`` table (``None``: empty).

    Raises:
        ValueError: not a mapping, or a key or name that is not a non-empty string.

    Example:
        >>> check_lora_names({"key1": "adapter-a"})
        {'key1': 'adapter-a'}
    """
    if lora_names is None:
        return {}
    if not isinstance(lora_names, Mapping):
        raise ValueError(f"kv_event_lora_names must be a mapping extra_key -> LoRA name, got {lora_names!r}")
    return {check_str("kv_event_lora_names key", k, nonempty=True): check_str(f"kv_event_lora_names[{k!r}]", v,
                                                                              nonempty=True)
            for k, v in lora_names.items()}


class RadixEventRecorder:
    """Hashes radix nodes' pages and queues their KV events, coalesced.

    Models SGLang 0.5.23 ``KVCacheEventRecorder`` with its ``KvEventLoraNames`` table (the
    scheduler registers a LoRA request's ``extra_key`` under its adapter name). With
    ``enabled=False`` every call is a no-op and :meth:`take` returns ``[]``.

    Args:
        enabled: record events (``--kv-events-config`` set).
        page_size: tokens per page (>= 1).
        lora_names: ``extra_key → LoRA adapter name`` of the registered adapters, or
            ``None`` for none.

    Raises:
        ValueError: a bad ``lora_names`` table.

    Example:
        >>> from kvlab.engines.sglang.tree_node import RadixKey
        >>> rec = RadixEventRecorder(enabled=True, page_size=4)
        >>> root, node = TreeNode(node_id=0, now=0), TreeNode(node_id=1, now=1)
        >>> node.parent, node.key = root, RadixKey([1, 2, 3, 4, 5, 6, 7, 8])
        >>> rec.hash_node(node); rec.record_store(node)
        >>> [(e.block_hashes, e.parent_block_hash) for e in rec.take()]
        [((-3488128144981237669, 5674439469042975057), None)]
    """

    def __init__(self, *, enabled: bool, page_size: int, lora_names: Mapping[str, str] | None = None) -> None:
        self.enabled = enabled
        self.page_size = page_size
        self.lora_names = check_lora_names(lora_names)
        """``extra_key → LoRA adapter name`` of the registered adapters (SGLang ``KvEventLoraNames``)."""
        self._queue: list[KVEvent] = []

    def register_lora(self, extra_key: str, lora_name: str) -> None:
        """Register ``extra_key`` as the namespace of LoRA adapter ``lora_name`` (SGLang
        ``KvEventLoraNames.register``); entries are never dropped.

        Raises:
            ValueError: a key or name that is not a non-empty string.
        """
        self.lora_names.update(check_lora_names({extra_key: lora_name}))

    def hash_node(self, node: TreeNode) -> None:
        """Set ``node.hash_value``: its pages' hex event-chain hashes, continuing from its
        parent's last one (``compute_node_event_hash_values``); the parent must be hashed."""
        if not self.enabled:
            return
        parent = node.parent
        prior = None if parent is None or parent.parent is None else parent.hash_value[-1]
        node.hash_value = sha256_page_chain(node.key.token_ids, self.page_size, prior)

    def _publish(self, node: TreeNode, hashes: list[str]) -> list[int]:
        """The published ids of ``hashes`` (pages of ``node``'s namespace), namespaced iff
        its ``extra_key`` is a registered LoRA adapter's (looked up now, as SGLang does)."""
        ids = [hash_str_to_int64(h) for h in hashes]
        extra_key = node.key.extra_key
        if extra_key is None or extra_key not in self.lora_names:
            return ids
        seed = kv_event_namespace_seed(extra_key, None)
        return [namespaced_block_hash(i, seed) for i in ids]

    def record_store(self, node: TreeNode) -> None:
        """``BlockStored`` for ``node``'s pages, one per page before coalescing, chained
        to the parent's last page (SGLang ``record_store``)."""
        if not self.enabled:
            return
        parent = node.parent
        parent_id = (None if parent is None or parent.parent is None
                     else self._publish(node, parent.hash_value[-1:])[0])
        # SGLang queues one event per page; a node's pages chain and share every field, so
        # they always coalesce into this one event.
        self.enqueue(BlockStored(block_hashes=self._publish(node, node.hash_value), parent_block_hash=parent_id,
                                 token_ids=node.key.token_ids, block_size=self.page_size, lora_id=None,
                                 medium=MEDIUM_GPU, lora_name=self.lora_names.get(node.key.extra_key)))

    def record_remove(self, node: TreeNode) -> None:
        """One ``BlockRemoved`` holding all of ``node``'s page ids, before coalescing."""
        if self.enabled and node.hash_value:
            self.enqueue(BlockRemoved(block_hashes=tuple(self._publish(node, node.hash_value)), medium=MEDIUM_GPU))

    def record_all_cleared(self) -> None:
        """``AllBlocksCleared`` (the whole cache was dropped)."""
        if self.enabled:
            self.enqueue(AllBlocksCleared())

    def enqueue(self, event: KVEvent) -> None:
        """Queue ``event``, merged into the queue's last event when compatible (SGLang
        ``KVCacheEventRecorder.enqueue``; module docstring)."""
        tail = self._queue[-1] if self._queue else None
        if isinstance(tail, BlockRemoved) and isinstance(event, BlockRemoved) and tail.medium == event.medium:
            self._queue[-1] = dataclasses.replace(tail, block_hashes=tail.block_hashes + event.block_hashes)
        elif (isinstance(tail, BlockStored) and isinstance(event, BlockStored) and tail.block_hashes
              and event.parent_block_hash == tail.block_hashes[-1]
              and (tail.medium, tail.lora_id, tail.block_size, tail.session_id, tail.lora_name)
              == (event.medium, event.lora_id, event.block_size, event.session_id, event.lora_name)):
            self._queue[-1] = dataclasses.replace(tail, block_hashes=tail.block_hashes + event.block_hashes,
                                                  token_ids=tail.token_ids + event.token_ids)
        else:
            self._queue.append(event)

    def take(self) -> list[KVEvent]:
        """The queued events, oldest first; clears the queue."""
        events, self._queue = self._queue, []
        return events
