"""Hypothesis state machine over the SGLang RadixCache model (docs/specs/engines.md §2.1).

Rules: insert random keys (a 4-token alphabet, two namespaces), start requests (match +
lock + allocate, evicting for room as SGLang's scheduler does), finish them
(``cache_finished_req``) or abort them (unlock + free), plain lookups, evictions of random
sizes, resets when idle, inserts that wrongly reuse the tree's slots (refused, no change);
page sizes 1 and 4, every eviction strategy, split events on or off.

Invariants after every step: lock refs >= 0 and equal to the running requests whose
matched path passes through the node; evictable + protected == total tokens, both equal a
recount; residency prefix-closed (every node's parent chain reaches the root, every
running request's node is in the tree); slots conserved (tree + requests' own + free ==
the pool, no slot twice; the cache's record of held slots is the tree's); the event-fed
index equals the tree's page ids.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from kvlab.engines.sglang.evict_policy import EVICTION_STRATEGIES
from kvlab.engines.sglang.radix_cache import RadixCache
from kvlab.engines.sglang.tree_node import RadixKey, TreeNode, iter_tree
from kvlab.events.types import AllBlocksCleared, BlockRemoved, BlockStored
from kvlab.hashing.sglang_hash import hash_str_to_int64, kv_event_namespace_seed, namespaced_block_hash

POOL_SLOTS = 64
TOKENS = st.lists(st.integers(0, 3), max_size=12)
NAMESPACES = st.sampled_from([None, "lora-a"])


class Request(NamedTuple):
    key: RadixKey
    kv: np.ndarray
    last_node: TreeNode
    prefix_len: int


class RadixCacheMachine(RuleBasedStateMachine):
    @initialize(page_size=st.sampled_from([1, 4]), policy=st.sampled_from(list(EVICTION_STRATEGIES)),
                split_events=st.booleans())
    def setup(self, page_size: int, policy: str, split_events: bool) -> None:
        # "lora-a" is a registered LoRA adapter, so its events are namespaced: an unregistered
        # extra_key publishes the plain ids, which two namespaces would then share (as in SGLang)
        self.cache = RadixCache(page_size=page_size, eviction_policy=policy, kv_pool_size=POOL_SLOTS,
                                enable_kv_cache_events=True, split_events=split_events,
                                kv_event_lora_names={"lora-a": "adapter-a"})
        self.running: list[Request] = []
        self.index: set[int] = set()
        self.seen: list[RadixKey] = []

    def draw_key(self, data: st.DataObject, min_size: int = 0) -> RadixKey:
        """A random key, half the time extending a prefix of an inserted one (so keys
        share prefixes and end inside nodes, locked ones too)."""
        key = RadixKey(data.draw(TOKENS), data.draw(NAMESPACES))
        if self.seen and data.draw(st.booleans()):
            earlier = data.draw(st.sampled_from(self.seen))
            cut = data.draw(st.integers(0, len(earlier)))
            key = RadixKey(earlier.token_ids[:cut] + key.token_ids[:4], earlier.extra_key)
        if len(key) < min_size:
            key = RadixKey([0] * min_size, key.extra_key)
        return key

    def alloc(self, n: int) -> np.ndarray | None:
        """Slots for ``n`` tokens, evicting first if the pool is short (SGLang's
        ``alloc_token_slots``); ``None`` when even that is not enough."""
        pool = self.cache.allocator
        if n > pool.available_size():
            self.cache.evict(n - pool.available_size())
        return pool.alloc(n)

    @rule(data=st.data(), priority=st.integers(0, 2))
    def insert(self, data: st.DataObject, priority: int) -> None:
        key = self.draw_key(data)
        slots = self.alloc(len(key))
        if slots is None:
            return
        prefix_len = self.cache.insert(key, slots, priority)
        self.seen.append(key)
        aligned = len(key) // self.cache.page_size * self.cache.page_size
        assert prefix_len % self.cache.page_size == 0 and prefix_len <= aligned
        self.cache.allocator.free(np.concatenate([slots[:prefix_len], slots[aligned:]]))  # the caller's duty
        hit = self.cache.match_prefix(key)
        assert hit.prefix_len == aligned and hit.indices[prefix_len:].tolist() == slots[prefix_len:aligned].tolist()

    @rule(data=st.data())
    def start_request(self, data: st.DataObject) -> None:
        key = self.draw_key(data, min_size=1)
        hit = self.cache.match_prefix(key[:len(key) - 1])  # S3: keep one token to compute
        self.cache.inc_lock_ref(hit.last_node)
        own = self.alloc(len(key) - 1 - hit.prefix_len)
        if own is None:
            self.cache.dec_lock_ref(hit.last_node)
            return
        self.running.append(Request(key, np.concatenate([hit.indices, own]), hit.last_node, hit.prefix_len))

    @precondition(lambda self: self.running)
    @rule(data=st.data(), priority=st.integers(0, 2))
    def finish_request(self, data: st.DataObject, priority: int) -> None:
        req = self.running.pop(data.draw(st.integers(0, len(self.running) - 1)))
        available = self.cache.allocator.available_size()
        released = self.cache.cache_finished_req(req.key, req.kv, req.last_node, priority=priority)
        self.seen.append(req.key)
        assert self.cache.allocator.available_size() == available + released

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def abort_request(self, data: st.DataObject) -> None:
        req = self.running.pop(data.draw(st.integers(0, len(self.running) - 1)))
        self.cache.dec_lock_ref(req.last_node)
        self.cache.allocator.free(req.kv[req.prefix_len:])

    @rule(data=st.data())
    def insert_with_the_trees_slots(self, data: st.DataObject) -> None:
        """A caller mistake: slots the tree holds given for new tokens. Refused with
        nothing changed; accepted only when no token of the key is new."""
        held = self.cache.tree_slots.owned()
        key = self.draw_key(data, min_size=1)
        if len(held) < len(key):
            return
        slots = data.draw(st.permutations(held.tolist()))[:len(key)]
        before = (self.cache.pretty(), self.cache.clock, self.cache.allocator.free_slots().tolist())
        try:
            prefix_len = self.cache.insert(key, slots)
        except ValueError as error:
            assert "that the tree already holds" in str(error)
            assert (self.cache.pretty(), self.cache.clock, self.cache.allocator.free_slots().tolist()) == before
        else:
            assert prefix_len == len(key) // self.cache.page_size * self.cache.page_size

    @rule(data=st.data())
    def lookup(self, data: st.DataObject) -> None:
        hit = self.cache.match_prefix(self.draw_key(data))
        assert hit.prefix_len == len(hit.indices) and hit.prefix_len % self.cache.page_size == 0

    @rule(num_tokens=st.integers(0, 16))
    def evict(self, num_tokens: int) -> None:
        before = self.cache.evictable_size()
        freed = self.cache.evict(num_tokens)
        assert self.cache.evictable_size() == before - freed
        assert freed >= num_tokens or freed == before  # short only when nothing evictable is left

    @precondition(lambda self: not self.running)
    @rule(roll=st.integers(0, 9))
    def reset(self, roll: int) -> None:
        if roll == 9:  # rarely: a reset empties the tree the other rules build up
            assert self.cache.reset() is True
            assert self.cache.allocator.available_size() == POOL_SLOTS

    def nodes(self) -> list[TreeNode]:
        return [node for node, _ in iter_tree(self.cache.root)]

    @invariant()
    def counters_match_a_recount(self) -> None:
        evictable = protected = 0
        for node in self.nodes()[1:]:
            assert node.lock_ref >= 0
            if node.lock_ref:
                protected += len(node.key)
            else:
                evictable += len(node.key)
        assert (self.cache.evictable_size(), self.cache.protected_size()) == (evictable, protected)
        assert self.cache.total_size() == evictable + protected

    @invariant()
    def locks_count_running_requests(self) -> None:
        expected = {self.cache.root.node_id: 1}
        for req in self.running:
            node = req.last_node
            while node is not self.cache.root:
                expected[node.node_id] = expected.get(node.node_id, 0) + 1
                node = node.parent
        assert {n.node_id: n.lock_ref for n in self.nodes() if n.lock_ref} == expected

    @invariant()
    def residency_is_prefix_closed(self) -> None:
        for node in self.nodes():
            for child_key, child in node.children.items():
                assert child.parent is node and child_key == child.key.child_key(self.cache.page_size)
                assert len(child.key) > 0 and len(child.key) % self.cache.page_size == 0
        in_tree = {id(n) for n in self.nodes()}
        for req in self.running:
            assert id(req.last_node) in in_tree

    @invariant()
    def slots_are_conserved(self) -> None:
        tree = [int(s) for n in self.nodes() for s in n.value]
        own = [int(s) for req in self.running for s in req.kv[req.prefix_len:]]
        free = self.cache.allocator.free_slots().tolist()
        assert sorted(tree + own + free) == list(range(1, POOL_SLOTS + 1))
        assert self.cache.tree_slots.owned().tolist() == sorted(tree)

    @invariant()
    def event_fed_index_equals_the_tree(self) -> None:
        for event in self.cache.take_events():
            if isinstance(event, BlockStored):
                assert event.parent_block_hash is None or event.parent_block_hash in self.index
                self.index.update(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                assert set(event.block_hashes) <= self.index
                self.index.difference_update(event.block_hashes)
            else:
                assert isinstance(event, AllBlocksCleared)
                self.index.clear()
        assert self.index == {i for n in self.nodes() for i in published_ids(n)}


def published_ids(node: TreeNode) -> list[int]:
    """The ids SGLang publishes for ``node``'s pages: int64 prefixes of its event-chain
    hashes, namespaced under the registered adapter ("lora-a")."""
    ids = [hash_str_to_int64(h) for h in node.hash_value]
    if node.key.extra_key is None:
        return ids
    seed = kv_event_namespace_seed(node.key.extra_key, None)
    return [namespaced_block_hash(i, seed) for i in ids]


TestRadixCacheMachine = RadixCacheMachine.TestCase
TestRadixCacheMachine.settings = settings(stateful_step_count=80)
