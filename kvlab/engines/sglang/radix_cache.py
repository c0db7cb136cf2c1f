"""SGLang's RadixCache: a radix tree of token spans mapping prefixes to KV slots.

Models ``sgl-project/sglang : python/sglang/srt/mem_cache/radix_cache.py :: RadixCache``
(SGLang 0.5.23, rules S1–S9 of docs/specs/engines.md §2.1). One request's life::

    r = cache.match_prefix(tokens[:-1])       S2/S3: page-aligned hit; may split a node
    cache.inc_lock_ref(r.last_node)           S6: the hit is protected while running
    own = cache.allocator.alloc(len(tokens) - 1 - r.prefix_len)   (prefill + decode KV)
    cache.cache_finished_req(tokens, [*r.indices, *own], r.last_node)
                                              S5: insert, free duplicates + tail, unlock
    cache.evict(n)                            S7: whole unlocked leaves, lowest score first

Unlike vLLM's lookup, ``match_prefix`` mutates the tree (splits, recency). Eviction
removes only leaves, so residency is prefix-closed (S8). The tree itself — its clock
(one tick per reading of SGLang's ``time.monotonic()``), nodes, splits, locks and
counters — is :mod:`kvlab.engines.sglang.tree_core`; its KV events (S9, coalesced as
SGLang queues them) are :mod:`kvlab.engines.sglang.events`.

Not modelled: ``cache_unfinished_req`` / ``checkpoint`` (chunked prefill; pass its
``inserted_len`` to :meth:`RadixCache.insert`), the prompt-boundary split 0.5.23's
``checkpoint`` makes, ``cache_salt`` namespaces, EAGLE bigram keys.

Checks SGLang does not make (:mod:`kvlab.engines.sglang.checks`): with a KV pool the cache
records which slots the tree holds and refuses new tokens whose slots the tree already
holds or that are not allocated, so no slot sits in two nodes; eviction and reset check
every slot before freeing any. Token ids must fit int64 (``< 2**63``), as SGLang's do.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

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
from kvlab.engines.sglang.tree_core import RadixTreeCore
from kvlab.engines.sglang.tree_node import (
    RadixKey,
    TreeNode,
    as_radix_key,
    iter_tree,
    matched_len,
    plan_eviction,
)
from kvlab.events.types import KVEvent
from kvlab.hashing.base import check_block_size

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


class RadixCache(RadixTreeCore):
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
        eviction_policy_config: the strategy's parameters (``--radix-eviction-policy-config``),
            e.g. ``{"threshold": 4096, "next_prompt_estimate": 512}`` for ``"tlru"``.
        kv_event_lora_names: ``extra_key → LoRA adapter name`` of the registered LoRA
            adapters (SGLang's ``KvEventLoraNames``; more with :meth:`register_lora`).
            Events of a namespace in it carry the adapter name and namespaced ids; any
            other ``extra_key`` publishes the plain ids and no name.

    Attributes:
        eviction_strategy: the strategy object (``eviction_strategy.name`` is its name).
        allocator: the :class:`~kvlab.engines.sglang.allocator.TokenToKVPoolAllocator`,
            or ``None`` without ``kv_pool_size``.
        tree_slots: the :class:`~kvlab.engines.sglang.checks.TreeSlots` record of the
            slots the tree holds, or ``None`` without ``kv_pool_size``.
        root: the root node (``lock_ref`` 1, no tokens); replaced by a reset.
        clock: the logical clock: a tick per operation stamp and per new node
            (:mod:`kvlab.engines.sglang.tree_core`).

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
          [1 2] #2 r=0 hit=1 t=5
            [3 4] #1 r=0 hit=1 t=4
        tokens 4: evictable 4, protected 0
        >>> cache.evict(1), cache.allocator.free_slots().tolist()[-2:]
        (2, [3, 4])
    """

    def __init__(self, page_size: int = 1, eviction_policy: str = "lru", kv_pool_size: int | None = None,
                 enable_kv_cache_events: bool = False, *, split_events: bool = False,
                 eviction_policy_config: Mapping[str, int] | None = None,
                 kv_event_lora_names: Mapping[str, str] | None = None) -> None:
        strategy = get_eviction_strategy(eviction_policy, eviction_policy_config)
        self.allocator = None
        tree_slots = None
        if kv_pool_size is not None:
            self.allocator = TokenToKVPoolAllocator(check_block_size(kv_pool_size, "kv_pool_size"))
            tree_slots = TreeSlots(self.allocator)
        page_size = check_block_size(page_size, "page_size")
        self.enable_kv_cache_events = check_flag("enable_kv_cache_events", enable_kv_cache_events)
        events = RadixEventRecorder(enabled=self.enable_kv_cache_events, page_size=page_size,
                                    lora_names=kv_event_lora_names)
        super().__init__(page_size, strategy, events, tree_slots, check_flag("split_events", split_events))

    @classmethod
    def create_simulated(cls, page_size: int = 1, enable_kv_cache_events: bool = False) -> RadixCache:
        """A cache without a KV pool (values are token ids), LRU eviction.

        Models SGLang ``RadixCache.create_simulated``.

        Raises:
            ValueError: bad ``page_size`` or flag.
        """
        return cls(page_size=page_size, enable_kv_cache_events=enable_kv_cache_events)

    # ----- public API ---------------------------------------------------------------

    def take_events(self) -> list[KVEvent]:
        """The KV events recorded since the last call, oldest first, coalesced as SGLang
        queues them; clears the queue.

        Models SGLang ``RadixCache.take_events``; always ``[]`` when events are off."""
        return self._events.take()

    def register_lora(self, extra_key: str, lora_name: str) -> None:
        """Register ``extra_key`` as the namespace of LoRA adapter ``lora_name``: its
        events from now on carry that name and namespaced ids (SGLang's scheduler registers
        a LoRA request's ``extra_key`` in ``KvEventLoraNames`` when it arrives).

        Raises:
            ValueError: a key or name that is not a non-empty string.
        """
        self._events.register_lora(extra_key, lora_name)

    def match_prefix(self, key: RadixKey | Sequence[int]) -> MatchResult:
        """The longest cached prefix of ``key``, in whole pages.

        Models SGLang ``RadixCache.match_prefix`` / ``_match_prefix_helper`` (rule S2):
        the key is cut to a page multiple (a key shorter than a page matches nothing and
        touches nothing); every visited node, the root included, gets
        ``last_access_time = now``; when the match ends inside a node, that node is
        split there (the upper half is a new node, stamped a tick later, copying
        ``lock_ref``, ``hit_count`` and ``priority``) and the upper half is
        ``last_node``. Only the key's namespace is searched (S1).

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
               priority: int = 0, inserted_len: int = 0) -> int:
        """Insert ``key`` with KV slots ``value``; return the prefix length already cached.

        Models SGLang 0.5.23 ``RadixCache.insert`` / ``_insert_helper`` (rule S4): the key
        is cut to a page multiple; the clock ticks and the root gets
        ``last_access_time = now`` and ``priority = max(root's, priority)``; every walked
        node gets the same; a partial match splits (the upper half is a new node, stamped
        later); the rest becomes a new leaf, stamped last. Hits are counted once per
        request: a walked node (the upper half of a split included) gets ``hit_count +=
        1``, and a new leaf starts at 1, only if it ends past ``inserted_len`` — the
        tokens this request inserted before (SGLang's ``req.kv.cache_inserted_len``, set by
        chunked-prefill checkpoints); else the leaf starts at 0. A key shorter than a page
        (or empty) adds no node and returns 0, but — as upstream, whose helper stamps the
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
            inserted_len: tokens of ``key`` this request already inserted (an integer >= 0).

        Raises:
            ValueError: a bad key (a token id ``>= 2**63`` included), priority or
                ``inserted_len``;
                ``value`` missing while the cache has a KV pool, of another length than
                ``key``, holding repeated slots or slots not allocated from the pool, or
                giving the new part of the key slots the tree already holds (names
                them). Nothing changes then, not even the clock.

        Example:
            >>> cache = RadixCache(page_size=4)
            >>> cache.insert([1, 2, 3], priority=5), cache.total_size(), cache.clock
            (0, 0, 2)
            >>> cache.root.last_access_time, cache.root.priority
            (2, 5)
        """
        key = as_radix_key(key)
        value = check_insert_value(key.token_ids, value, self.allocator)
        priority = check_int("priority", priority)
        inserted_len = check_count("inserted_len", inserted_len)
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
            prefix_len += matched
            child.hit_count += int(prefix_len > inserted_len)
            node, key, value = child, key[matched:], value[matched:]
        if len(key):
            self._add_leaf(node, key, value, priority, int(prefix_len + len(key) > inserted_len))
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

    def reset(self, *, refuse_if_locked: bool = False) -> bool:
        """Drop the whole tree, returning its slots to the pool, and publish
        ``AllBlocksCleared``.

        Models SGLang ``RadixCache.reset``, which drops the tree whatever holds it: a
        request locked in the old tree can no longer be finished (its ``last_node`` is
        foreign — SGLang's ``dec_lock_ref`` then fails an assertion), and the slots of
        locked nodes stay allocated, the running requests' (SGLang's
        ``Scheduler.flush_cache`` clears the whole pool, and only when no request runs).
        Doing so warns. With ``refuse_if_locked=True`` the cache refuses instead while
        any node is locked — ``flush_cache``'s rule, and kvlab's default before issue 14.
        A request that matched nothing holds only the root, which no reset refuses for.
        The clock and node ids keep counting, so nodes from before the reset are rejected
        as foreign.

        Returns:
            ``True`` when reset; ``False`` (nothing changed) when ``refuse_if_locked`` and
            a node is locked.

        Raises:
            ValueError: ``refuse_if_locked`` not a bool.
            RuntimeError: an unlocked node's slot is repeated, not held by the tree or
                already free (a bug); nothing changes then.

        Example:
            >>> cache = RadixCache()
            >>> cache.insert([1, 2])
            0
            >>> cache.inc_lock_ref(cache.match_prefix([1, 2]).last_node)
            2
            >>> cache.reset(refuse_if_locked=True), cache.total_size()
            (False, 2)
        """
        check_flag("refuse_if_locked", refuse_if_locked)
        nodes = [node for node, depth in iter_tree(self.root) if depth > 0]
        locked = [node for node in nodes if node.lock_ref > 0]
        if locked and refuse_if_locked:
            return False
        self._free(np.concatenate([n.value for n in nodes if n.lock_ref == 0] or [_EMPTY]), "reset")
        if locked:
            if self.tree_slots is not None:
                self.tree_slots.disown(np.concatenate([n.value for n in locked]))
            warnings.warn(f"reset() dropped {len(locked)} locked node(s) holding {self._protected} tokens, as "
                          f"SGLang's RadixCache.reset does: the requests locking them cannot be finished and "
                          f"their slots stay allocated; pass refuse_if_locked=True to refuse instead",
                          RuntimeWarning, stacklevel=2)
        self._new_tree()
        return True

    def __repr__(self) -> str:
        return (f"RadixCache(page_size={self.page_size}, eviction_policy={self.eviction_strategy.name!r}, "
                f"tokens={self.total_size()}, evictable={self._evictable}, protected={self._protected})")
