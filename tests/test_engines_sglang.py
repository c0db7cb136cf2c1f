"""SGLang RadixCache model (docs/specs/engines.md §2.1, rules S1–S9): golden scenarios with
exact node ids, slots, eviction orders and KV event ids; the bug-report lock cases; every
eviction policy on one tree; namespaces; splits; de-duplication; page truncation; bad
input."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from kvlab.engines.sglang.allocator import TokenToKVPoolAllocator
from kvlab.engines.sglang.evict_policy import EVICTION_STRATEGIES, SLRUStrategy, get_eviction_strategy
from kvlab.engines.sglang.radix_cache import MatchResult, RadixCache
from kvlab.engines.sglang.tree_node import RadixKey
from kvlab.events.types import AllBlocksCleared, BlockRemoved, BlockStored
from kvlab.hashing.base import RequestExtras
from kvlab.hashing.sglang_hash import SGLangHasher

# SGLang event ids (page size 4, no namespace) of [1 2 3 4], then [5 6 7 8] or [9 10 11 12] after it.
P1234 = -3488128144981237669
P5678 = 5674439469042975057
P9_12 = 2765072662650123319


def check_counters(cache: RadixCache) -> None:
    """Counters equal a recount from the tree; no lock count is negative."""
    frame = cache.snapshot()
    nodes = frame.filter(pl.col("depth") > 0)
    evictable = nodes.filter(pl.col("lock_ref") == 0)["num_tokens"].sum()
    protected = nodes.filter(pl.col("lock_ref") > 0)["num_tokens"].sum()
    assert (frame["lock_ref"] >= 0).all()
    assert frame.filter(pl.col("depth") == 0)["lock_ref"].to_list() == [1]
    assert (cache.evictable_size(), cache.protected_size()) == (evictable, protected)
    assert evictable + protected == cache.total_size() == nodes["num_tokens"].sum()
    assert cache.evictable_size() >= 0 and cache.protected_size() >= 0


def lock_refs(cache: RadixCache) -> dict[int, int]:
    frame = cache.snapshot()
    return dict(zip(frame["node_id"].to_list(), frame["lock_ref"].to_list(), strict=True))


def stored(block_ids: tuple[int, ...], parent: int | None, tokens: tuple[int, ...], block_size: int) -> BlockStored:
    return BlockStored(block_hashes=block_ids, parent_block_hash=parent, token_ids=tokens, block_size=block_size,
                       lora_id=None, medium="GPU", lora_name=None)


# ----- the bug-report cases -----------------------------------------------------------

def test_bug_case_3_lock_covers_the_matched_node_and_its_ancestors() -> None:
    cache = RadixCache(kv_pool_size=16)
    a_slots = cache.allocator.alloc(4)
    assert cache.insert([1, 2, 3, 4], a_slots) == 0
    assert cache.insert(list(range(1, 9)), np.concatenate([a_slots, cache.allocator.alloc(4)])) == 4
    hit = cache.match_prefix(list(range(1, 10)))
    assert hit.indices.tolist() == [1, 2, 3, 4, 5, 6, 7, 8] and hit.prefix_len == 8
    assert hit.last_node.node_id == 2 and hit.last_node.parent.node_id == 1
    assert cache.inc_lock_ref(hit.last_node) == 8
    assert cache.evict(100) == 0
    assert lock_refs(cache) == {0: 1, 1: 1, 2: 1}
    assert (cache.evictable_size(), cache.protected_size(), cache.allocator.available_size()) == (0, 8, 8)
    check_counters(cache)
    assert cache.dec_lock_ref(hit.last_node) == 8
    assert lock_refs(cache) == {0: 1, 1: 0, 2: 0}
    assert cache.evict(100) == 8
    # Bn's slots go back first, then its parent A's (pushed when it became a leaf)
    assert cache.allocator.free_slots().tolist() == [9, 10, 11, 12, 13, 14, 15, 16, 5, 6, 7, 8, 1, 2, 3, 4]
    check_counters(cache)


def test_bug_case_5_split_lock_short_insert_unlock_evict_page_size_4() -> None:
    cache = RadixCache(page_size=4)
    assert cache.insert(list(range(1, 9))) == 0
    check_counters(cache)
    assert cache.insert([1, 2, 3, 4, 9, 10, 11, 12]) == 4
    assert cache.snapshot().select("node_id", "parent_id", "num_tokens").rows() == [
        (0, None, 0), (2, 0, 4), (1, 2, 4), (3, 2, 4)]
    check_counters(cache)
    hit = cache.match_prefix([1, 2, 3, 4, 9, 10, 11, 12])
    assert (hit.prefix_len, hit.last_node.node_id) == (8, 3)
    assert cache.inc_lock_ref(hit.last_node) == 8
    assert (cache.evictable_size(), cache.protected_size()) == (4, 8)
    check_counters(cache)
    assert cache.insert([1, 2, 3]) == 0  # shorter than a page: nothing, no error
    assert cache.total_size() == 12
    check_counters(cache)
    assert cache.dec_lock_ref(hit.last_node) == 8
    check_counters(cache)
    assert cache.evict(12) == 12
    assert (cache.total_size(), cache.evictable_size(), cache.protected_size()) == (0, 0, 0)
    check_counters(cache)


# ----- eviction policies ------------------------------------------------------------

# SGLang 0.5.23's orders on these operations (tlru with its defaults is LRU).
POLICY_ORDERS = {"lru": [4, 1, 2, 3], "mru": [3, 2, 1, 4], "fifo": [1, 2, 3, 4], "filo": [4, 3, 2, 1],
                 "lfu": [4, 2, 3, 1], "priority": [4, 1, 3, 2], "slru": [4, 2, 1, 3], "tlru": [4, 1, 2, 3]}


@pytest.mark.parametrize("policy", list(EVICTION_STRATEGIES))
def test_each_policy_evicts_leaves_in_its_order(policy: str) -> None:
    cache = RadixCache(eviction_policy=policy, enable_kv_cache_events=True)  # root: t1
    cache.insert([1])               # stamp t2, A made t3
    cache.insert([2], priority=9)   # t4, B t5
    cache.insert([3])               # t6, C t7
    cache.insert([4])               # t8, D t9
    cache.insert([1])               # t10  A: 2 hits
    cache.insert([1])               # t11  A: 3 hits
    cache.match_prefix([2])         # t12  B touched (no hit counted)
    cache.insert([3])               # t13  C: 2 hits
    frame = cache.snapshot().filter(pl.col("depth") == 1).sort("node_id")
    assert frame.select("first_tokens", "creation_time", "last_access_time", "hit_count", "priority").rows() == [
        ("[1]", 3, 11, 3, 0), ("[2]", 5, 12, 1, 9), ("[3]", 7, 13, 2, 0), ("[4]", 9, 9, 1, 0)]
    token_of = {e.block_hashes[0]: e.token_ids[0] for e in cache.take_events() if isinstance(e, BlockStored)}
    assert cache.evict(4) == 4
    (removed,) = cache.take_events()  # one BlockRemoved: SGLang coalesces consecutive removals
    assert [token_of[h] for h in removed.block_hashes] == POLICY_ORDERS[policy]


def test_evict_one_token_frees_one_whole_node_lowest_score_first() -> None:
    cache = RadixCache(eviction_policy="lfu")
    cache.insert([1, 2, 3])
    cache.insert([7, 8])
    cache.insert([7, 8])
    assert cache.evict(1) == 3  # granularity is a whole node: overshoots
    assert cache.snapshot()["first_tokens"].to_list() == ["[]", "[7 8]"]
    assert cache.evict(0) == 0


def test_a_parent_left_childless_joins_the_same_eviction_heap() -> None:
    cache = RadixCache(enable_kv_cache_events=True)
    cache.insert([1, 2, 3, 4])  # stamp t2, leaf t3
    cache.insert([1, 2])        # stamp t4: split, [1 2] #2 (new, t5) -> [3 4] #1 (t4)
    cache.insert([9])           # stamp t6, leaf t7
    stored_1234, stored_9 = cache.take_events()[1:]
    token_of = dict(zip(stored_1234.block_hashes, stored_1234.token_ids, strict=True)) | {stored_9.block_hashes[0]: 9}
    assert cache.evict(100) == 5
    (removed,) = cache.take_events()
    assert [token_of[h] for h in removed.block_hashes] == [3, 4, 1, 2, 9]  # [1 2] (t5) is pushed, beats [9] (t7)


def test_match_prefix_refreshes_recency_of_every_visited_node_and_the_root() -> None:
    cache = RadixCache(enable_kv_cache_events=True)
    cache.insert([1, 2, 3, 4])  # t2, leaf t3
    cache.insert([1, 2])        # t4, split: upper t5
    cache.insert([9])           # t6, leaf t7
    hit = cache.match_prefix([1, 2, 3, 4, 5])  # t8 visits root, [1 2], [3 4]
    assert hit.prefix_len == 4 and cache.clock == 8
    frame = cache.snapshot()
    touched = dict(zip(frame["first_tokens"], frame["last_access_time"], strict=True))
    assert touched == {"[]": 8, "[1 2]": 8, "[3 4]": 8, "[9]": 7}
    h1, h2, h3, h4 = SGLangHasher(page_size=1).event_block_hashes([1, 2, 3, 4])
    (h9,) = SGLangHasher(page_size=1).event_block_hashes([9])
    cache.take_events()
    assert cache.evict(100) == 5
    assert [e.block_hashes for e in cache.take_events()] == [(h9, h3, h4, h1, h2)]  # SGLang 0.5.23's order


# ----- splits, namespaces, hits ------------------------------------------------------

def test_split_upper_half_copies_lock_ref_hit_count_and_priority() -> None:
    cache = RadixCache(page_size=4)
    cache.insert(list(range(1, 9)), priority=3)  # stamp t2, node #1 made t3: 1 hit
    cache.insert(list(range(1, 9)))              # t4: 2 hits, priority stays 3
    held = cache.match_prefix(list(range(1, 9)))  # t5
    cache.inc_lock_ref(held.last_node)
    hit = cache.match_prefix([1, 2, 3, 4, 99, 99, 99, 99])  # t6: ends inside #1 -> split, upper #2 made t7
    assert hit.indices.tolist() == [1, 2, 3, 4] and hit.last_node.node_id == 2
    frame = cache.snapshot().select("node_id", "parent_id", "first_tokens", "lock_ref", "hit_count", "priority",
                                    "last_access_time", "creation_time")
    assert frame.rows() == [(0, None, "[]", 1, 0, 3, 6, 1),
                            (2, 0, "[1 2 3 4]", 1, 2, 3, 7, 7),   # stamped after the lower half, as upstream
                            (1, 2, "[5 6 7 8]", 1, 2, 3, 6, 3)]
    assert (cache.evictable_size(), cache.protected_size()) == (0, 8)
    assert cache.dec_lock_ref(held.last_node) == 8
    check_counters(cache)


def test_insert_counts_hits_on_walked_nodes_once_per_request() -> None:
    """SGLang 0.5.23: a node counts a hit only past ``inserted_len``, the tokens the
    request inserted before (chunked-prefill checkpoints)."""
    cache = RadixCache()
    cache.insert([1, 2], inserted_len=2)
    cache.insert([1, 2, 3], inserted_len=3)
    assert cache.snapshot()["hit_count"].to_list() == [0, 0, 0]
    cache.insert([1, 2, 3])
    cache.insert([1, 2, 5])  # splits nothing: [1 2] is its own node; new leaf [5]
    assert cache.snapshot().select("first_tokens", "hit_count").rows() == [
        ("[]", 0), ("[1 2]", 2), ("[3]", 1), ("[5]", 1)]


def test_namespaces_never_match_each_other() -> None:
    cache = RadixCache(enable_kv_cache_events=True, kv_event_lora_names={"lora-a": "lora-a"})
    cache.take_events()
    assert cache.insert(RadixKey([1, 2, 3], extra_key="lora-a")) == 0
    assert cache.match_prefix([1, 2, 3]).prefix_len == 0
    assert cache.match_prefix(RadixKey([1, 2, 3], "lora-b")).last_node is cache.root
    assert cache.match_prefix(RadixKey([1, 2, 3, 4], "lora-a")).indices.tolist() == [1, 2, 3]
    assert cache.insert([1, 2, 3]) == 0
    assert cache.total_size() == 6 and sorted(map(str, cache.root.children)) == ["('lora-a', 1)", "1"]
    assert cache.snapshot()["first_tokens"].to_list() == ["[]", "lora-a:[1 2 3]", "[1 2 3]"]
    hasher = SGLangHasher(page_size=1)
    a_ids = hasher.event_block_hashes([1, 2, 3], RequestExtras(lora_name="lora-a"))
    plain_ids = hasher.event_block_hashes([1, 2, 3])
    assert a_ids == [-7561841190639055718, -6701250189338953919, -1701916035728534620]
    assert plain_ids == [7470307888890966271, -1634645291211865391, 7325169757385981536]
    events = cache.take_events()  # as SGLang 0.5.23 publishes them ("lora-a" a registered LoRA adapter)
    assert [(list(e.block_hashes), e.lora_name) for e in events] == [(a_ids, "lora-a"), (plain_ids, None)]
    with pytest.raises(ValueError, match="different namespaces"):
        RadixKey([1], "lora-a").match(RadixKey([1]))


# ----- requests: de-duplication, page truncation -------------------------------------

def test_finished_requests_free_duplicate_slots_de_duplication() -> None:
    cache = RadixCache(kv_pool_size=32)
    pool = cache.allocator
    tokens = [1, 2, 3, 4, 5, 6]  # input [1..5], output [6]: 5 tokens have KV
    r1, r2 = cache.match_prefix(tokens[:-1]), cache.match_prefix(tokens[:-1])
    assert r1.last_node is r2.last_node is cache.root and r1.prefix_len == 0
    own1, own2 = pool.alloc(5), pool.alloc(5)
    assert (own1.tolist(), own2.tolist(), pool.available_size()) == ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10], 22)
    assert cache.cache_finished_req(tokens, own1, r1.last_node) == 0
    assert cache.cache_finished_req(tokens, own2, r2.last_node) == 5  # r2's copy is a duplicate
    assert pool.available_size() == 27 and pool.free_slots().tolist()[-5:] == [6, 7, 8, 9, 10]
    assert cache.match_prefix(tokens).indices.tolist() == [1, 2, 3, 4, 5]
    # a third request reuses the cached prefix and adds one token of its own
    r3 = cache.match_prefix([1, 2, 3, 4, 5, 7])
    cache.inc_lock_ref(r3.last_node)
    own3 = pool.alloc(1)
    assert cache.cache_finished_req([1, 2, 3, 4, 5, 7, 8], np.concatenate([r3.indices, own3]), r3.last_node) == 0
    assert (cache.total_size(), cache.protected_size(), pool.available_size()) == (6, 0, 26)
    assert pool.available_size() + cache.total_size() == 32
    check_counters(cache)


def test_finished_request_frees_the_unaligned_tail() -> None:
    cache = RadixCache(page_size=4, kv_pool_size=32)
    own = cache.allocator.alloc(10)  # 11 tokens, the last without KV
    assert cache.cache_finished_req(list(range(1, 12)), own, cache.root) == 2
    assert cache.allocator.free_slots().tolist()[-2:] == [9, 10]
    assert (cache.total_size(), cache.allocator.available_size()) == (8, 24)
    assert cache.match_prefix(list(range(1, 12))).indices.tolist() == [1, 2, 3, 4, 5, 6, 7, 8]


def test_page_size_truncates_lookups_and_inserts() -> None:
    cache = RadixCache(page_size=4)
    assert cache.match_prefix([1, 2, 3]) == MatchResult(cache.match_prefix([]).indices, cache.root, 0)
    assert cache.clock == 1  # the root's creation only: a lookup shorter than a page touches nothing
    assert cache.insert([1, 2, 3, 4, 5, 6]) == 0
    assert cache.total_size() == 4
    assert cache.match_prefix([1, 2, 3, 4, 5, 6, 7]).prefix_len == 4
    assert cache.insert([1, 2, 3, 4, 5, 6, 7, 9]) == 4
    assert cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8]).prefix_len == 4  # a page counts only whole


def test_create_simulated_uses_token_ids_as_values() -> None:
    cache = RadixCache.create_simulated(page_size=2)
    assert cache.allocator is None and cache.page_size == 2
    cache.insert([7, 8, 9])
    assert cache.match_prefix([7, 8, 9]).indices.tolist() == [7, 8]


# ----- KV events ------------------------------------------------------------------------

def test_events_for_insert_evict_reset_with_exact_ids() -> None:
    assert SGLangHasher(page_size=4).event_block_hashes(range(1, 9)) == [P1234, P5678]
    assert SGLangHasher(page_size=4).event_block_hashes([1, 2, 3, 4, 9, 10, 11, 12]) == [P1234, P9_12]
    cache = RadixCache(page_size=4, enable_kv_cache_events=True)
    assert cache.take_events() == [AllBlocksCleared()]  # SGLang's __init__ calls reset()
    cache.insert(list(range(1, 9)))  # one event for the node's two pages, as SGLang coalesces them
    assert cache.take_events() == [stored((P1234, P5678), None, (1, 2, 3, 4, 5, 6, 7, 8), 4)]
    cache.insert([1, 2, 3, 4, 9, 10, 11, 12])  # splits [1..8]: chained ids survive, nothing published
    assert cache.take_events() == [stored((P9_12,), P1234, (9, 10, 11, 12), 4)]
    assert cache.evict(4) == 4  # [5..8] was stamped by the walk, before the split made [1..4] and [9..12]
    assert cache.take_events() == [BlockRemoved(block_hashes=(P5678,), medium="GPU")]
    assert cache.evict(100) == 8
    assert cache.take_events() == [BlockRemoved((P9_12, P1234), "GPU")]
    cache.insert([1, 2, 3, 4])
    assert cache.reset() is True
    assert cache.take_events() == [stored((P1234,), None, (1, 2, 3, 4), 4), AllBlocksCleared()]
    assert cache.take_events() == []


def test_split_events_give_the_mid_2025_remove_then_store_both_halves() -> None:
    cache = RadixCache(page_size=4, enable_kv_cache_events=True, split_events=True)
    cache.insert(list(range(1, 9)))
    cache.take_events()
    cache.match_prefix([1, 2, 3, 4, 99, 99, 99, 99])
    # the two halves' stores chain, so they coalesce into one event, as 0.5.23 queues them
    assert cache.take_events() == [BlockRemoved((P1234, P5678), "GPU"),
                                   stored((P1234, P5678), None, (1, 2, 3, 4, 5, 6, 7, 8), 4)]


def test_multi_page_node_events_chain_through_the_parent() -> None:
    cache = RadixCache(page_size=2, enable_kv_cache_events=True)
    cache.insert([1, 2, 3, 4])
    cache.insert([1, 2, 3, 4, 5, 6, 7, 8])
    ids = SGLangHasher(page_size=2).event_block_hashes(range(1, 9))
    # the second node's store continues the first one's chain: one event (SGLang 0.5.23)
    assert cache.take_events()[1:] == [stored(tuple(ids), None, tuple(range(1, 9)), 2)]
    cache.evict(100)
    assert cache.take_events() == [BlockRemoved((ids[2], ids[3], ids[0], ids[1]), "GPU")]


def test_events_off_records_nothing() -> None:
    cache = RadixCache()
    cache.insert([1, 2])
    cache.evict(2)
    cache.reset()
    assert cache.take_events() == []
    assert cache.root.hash_value == [] and cache.snapshot().height == 1


# ----- locks, reset, inspection --------------------------------------------------------

def test_unlock_without_a_lock_is_a_caller_mistake_and_changes_nothing() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3])
    node = cache.match_prefix([1, 2, 3]).last_node
    with pytest.raises(ValueError, match=r"node TreeNode\(id=1, .*\) is not locked \(lock_ref 0\)"):
        cache.dec_lock_ref(node)
    with pytest.raises(ValueError, match=r"last_node TreeNode\(id=1, .*\) is not locked \(lock_ref 0\)"):
        cache.cache_finished_req([1, 2, 3, 4], [1, 2, 3], node)
    assert lock_refs(cache) == {0: 1, 1: 0} and cache.clock == 4
    check_counters(cache)
    # the root's lock is permanent: locking / unlocking it (a request that matched nothing) is a no-op, as upstream
    assert cache.inc_lock_ref(cache.root) == 0 and cache.dec_lock_ref(cache.root) == 0
    assert cache.dec_lock_ref(cache.root) == 0 and cache.root.lock_ref == 1


def test_finishing_a_request_twice_is_a_caller_mistake() -> None:
    cache = RadixCache(kv_pool_size=8)
    cache.insert([1, 2], cache.allocator.alloc(2))
    hit = cache.match_prefix([1, 2, 3])
    cache.inc_lock_ref(hit.last_node)
    kv = np.concatenate([hit.indices, cache.allocator.alloc(1)])
    assert cache.cache_finished_req([1, 2, 3, 4], kv, hit.last_node) == 0
    state = (cache.pretty(), cache.clock, cache.allocator.free_slots().tolist())
    with pytest.raises(ValueError, match=r"last_node TreeNode\(id=1, .*\) is not locked \(lock_ref 0\): an unlock "
                                         r"without a matching inc_lock_ref, or a request finished twice"):
        cache.cache_finished_req([1, 2, 3, 4], kv, hit.last_node)
    assert (cache.pretty(), cache.clock, cache.allocator.free_slots().tolist()) == state


def test_a_locked_node_under_an_unlocked_ancestor_is_a_bug() -> None:
    cache = RadixCache()
    cache.insert([1, 2])
    cache.insert([1, 2, 3])
    deep = cache.match_prefix([1, 2, 3]).last_node
    cache.inc_lock_ref(deep)
    deep.parent.lock_ref = 0  # corrupt the tree: an ancestor must hold every lock of its subtree
    with pytest.raises(RuntimeError, match="lock_ref of node 1 .* indicates a bug"):
        cache.dec_lock_ref(deep)
    assert deep.lock_ref == 1


def test_nested_locks_count_per_request() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3, 4])
    cache.insert([1, 2, 9])
    deep, shallow = cache.match_prefix([1, 2, 3, 4]).last_node, cache.match_prefix([1, 2]).last_node
    assert cache.inc_lock_ref(deep) == 4 and cache.inc_lock_ref(shallow) == 0
    assert lock_refs(cache) == {0: 1, 2: 2, 1: 1, 3: 0}  # [1 2] #2 -> [3 4] #1, [9] #3
    assert cache.evict(100) == 1  # only [9]
    assert cache.dec_lock_ref(deep) == 2 and cache.dec_lock_ref(shallow) == 2
    check_counters(cache)


def test_stale_and_foreign_nodes_are_rejected() -> None:
    cache, other = RadixCache(), RadixCache()
    cache.insert([1])
    node = cache.match_prefix([1]).last_node
    with pytest.raises(ValueError, match="node must be a node of this cache's tree"):
        other.inc_lock_ref(node)
    cache.evict(1)
    with pytest.raises(ValueError, match="node must be a node of this cache's tree"):
        cache.inc_lock_ref(node)
    with pytest.raises(ValueError, match="last_node must be a node"):
        cache.cache_finished_req([1, 2], [1], "root")


def test_reset_refused_while_locked_on_request_and_returns_slots() -> None:
    cache = RadixCache(kv_pool_size=8, enable_kv_cache_events=True)
    cache.insert([1, 2, 3], cache.allocator.alloc(3))
    old = cache.match_prefix([1, 2, 3]).last_node
    cache.inc_lock_ref(old)
    cache.take_events()
    assert cache.reset(refuse_if_locked=True) is False and cache.total_size() == 3 and cache.take_events() == []
    cache.dec_lock_ref(old)
    assert cache.reset() is True
    assert (cache.total_size(), cache.allocator.available_size(), cache.root.node_id) == (0, 8, 2)
    assert cache.take_events() == [AllBlocksCleared()]
    with pytest.raises(ValueError, match="not from before a reset"):
        cache.inc_lock_ref(old)


def test_snapshot_pretty_and_repr() -> None:
    cache = RadixCache(page_size=2, eviction_policy="slru")
    cache.insert([1, 2, 3, 4, 5, 6, 7, 8, 9])
    cache.insert([1, 2, 3, 4, 10, 11])
    cache.inc_lock_ref(cache.match_prefix([1, 2, 3, 4, 10, 11]).last_node)
    frame = cache.snapshot()
    assert frame.schema == {"node_id": pl.Int64, "parent_id": pl.Int64, "depth": pl.Int64, "num_tokens": pl.Int64,
                            "first_tokens": pl.String, "lock_ref": pl.Int64, "evictable": pl.Boolean,
                            "last_access_time": pl.Int64, "hit_count": pl.Int64, "extra_key": pl.String,
                            "priority": pl.Int64, "creation_time": pl.Int64}
    # ticks: root 1; insert 2 (leaf #1: 3); insert 4 (split: #2 5, leaf #3 6); match 7
    assert frame.drop("extra_key", "priority").rows() == [
        (0, None, 0, 0, "[]", 1, False, 7, 0, 1),
        (2, 0, 1, 4, "[1 2 3 4]", 1, False, 7, 2, 5),
        (1, 2, 2, 4, "[5 6 7 8]", 0, True, 4, 1, 3),
        (3, 2, 2, 2, "[10 11]", 1, False, 7, 1, 6)]
    assert cache.pretty() == ("root #0 r=1\n"
                              "  [1 2 3 4] #2 r=1 hit=2 t=7\n"
                              "    [5 6 7 8] #1 r=0 hit=1 t=4\n"
                              "    [10 11] #3 r=1 hit=1 t=7\n"
                              "tokens 10: evictable 4, protected 6")
    assert repr(cache) == "RadixCache(page_size=2, eviction_policy='slru', tokens=10, evictable=4, protected=6)"
    assert repr(cache.root.children[(1, 2)]) == "TreeNode(id=2, key=[1 2 3 4], lock_ref=1, hit_count=2)"
    long_key = RadixKey(range(10), "ns")
    assert repr(long_key) == "RadixKey(extra_key='ns', token_ids=[0 1 2 3 4 5 …])"


# ----- policies registry, allocator, bad input ----------------------------------------

def test_policy_registry_names_and_errors() -> None:
    assert list(EVICTION_STRATEGIES) == ["lru", "lfu", "fifo", "mru", "filo", "priority", "slru", "tlru"]
    assert all(get_eviction_strategy(name).name == name for name in EVICTION_STRATEGIES)
    with pytest.raises(ValueError, match=r"eviction_policy must be one of \['lru', 'lfu', 'fifo', 'mru', 'filo', "
                                         r"'priority', 'slru', 'tlru'\], got 'arc'"):
        RadixCache(eviction_policy="arc")
    with pytest.raises(ValueError, match="eviction_policy_config has 'threshold', which the 'slru' policy does not "
                                         r"take \(it takes \['protected_threshold'\]\)"):
        RadixCache(eviction_policy="slru", eviction_policy_config={"threshold": 1})
    with pytest.raises(ValueError, match="next_prompt_estimate must be an integer >= 0, got -1"):
        RadixCache(eviction_policy="tlru", eviction_policy_config={"next_prompt_estimate": -1})
    assert RadixCache(eviction_policy="slru", eviction_policy_config={"protected_threshold": 3}).eviction_strategy \
        .protected_threshold == 3
    with pytest.raises(ValueError, match="got None"):
        get_eviction_strategy(None)
    with pytest.raises(ValueError, match="protected_threshold must be an integer >= 1, got 0"):
        SLRUStrategy(protected_threshold=0)


def test_allocator_reuse_order_and_double_free() -> None:
    pool = TokenToKVPoolAllocator(3)
    assert pool.alloc(0).tolist() == [] and pool.alloc(4) is None
    slots = pool.alloc(3)
    pool.free(slots[::-1])
    assert pool.free_slots().tolist() == [3, 2, 1]
    for bad in ([1], [0], [4], [2.0]):
        with pytest.raises(ValueError, match="indices must be"):
            pool.free(bad)
    pool.alloc(2)
    with pytest.raises(ValueError, match="indices must be distinct"):
        pool.free([3, 3])
    assert repr(pool) == "TokenToKVPoolAllocator(size=3, available=1)"
    with pytest.raises(ValueError, match="size must be an integer >= 1, got 0"):
        TokenToKVPoolAllocator(0)
    with pytest.raises(ValueError, match="need_size must be an integer >= 0, got -1"):
        pool.alloc(-1)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"page_size": 0}, "page_size must be an integer >= 1, got 0"),
    ({"kv_pool_size": 0}, "^kv_pool_size must be an integer >= 1, got 0"),
    ({"kv_pool_size": 2**31}, "^kv_pool_size must be below 2\\*\\*31"),
    ({"enable_kv_cache_events": 1}, "enable_kv_cache_events must be a bool, got 1"),
    ({"split_events": "yes"}, "split_events must be a bool, got 'yes'"),
])
def test_bad_constructor_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RadixCache(**kwargs)


def test_bad_calls_raise_value_error_naming_the_parameter() -> None:
    cache = RadixCache(kv_pool_size=8)
    slots = cache.allocator.alloc(3)
    cases = [
        (lambda: cache.insert([1, 2, 3]), "value is required when the cache has a KV pool"),
        (lambda: cache.insert([1, 2, 3], slots[:2]), r"value must hold one slot per token of key \(3\), got 2"),
        (lambda: cache.insert([1, 2], [7, 8]), r"value must hold distinct slots allocated .* got \[7, 8\]"),
        (lambda: cache.insert([1, 2], [1, 1]), "value must hold distinct slots"),
        (lambda: cache.insert([1], [-1]), "value must be a 1-D sequence of non-negative integer slots"),
        (lambda: cache.insert([1], slots[:1], priority=1.5), "priority must be an integer, got 1.5"),
        (lambda: cache.insert([1], slots[:1], inserted_len=-1), "inserted_len must be an integer >= 0, got -1"),
        (lambda: cache.evict(-1), "num_tokens must be an integer >= 0, got -1"),
        (lambda: cache.match_prefix("abc"), "key must be a RadixKey or a sequence of token ids"),
        (lambda: cache.match_prefix([1, -2]), "token_ids must be >= 0"),
        (lambda: RadixKey([1], extra_key=""), "extra_key must be a non-empty string or None, got ''"),
        (lambda: RadixKey([1])[0], "index must be a slice with step 1, got 0"),
        (lambda: cache.cache_finished_req([1, 2, 3], slots, cache.root), r"len\(key\) - 1 = 2 slots"),
        (lambda: cache.cache_finished_req([], [], cache.root), "key must hold at least one token"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    assert cache.total_size() == 0 and cache.allocator.available_size() == 5


def test_finished_request_must_continue_its_matched_path() -> None:
    cache = RadixCache(kv_pool_size=16)
    cache.insert(RadixKey([1, 2], "a"), cache.allocator.alloc(2))
    hit = cache.match_prefix(RadixKey([1, 2, 3], "a"))
    cache.inc_lock_ref(hit.last_node)
    own = cache.allocator.alloc(1)
    with pytest.raises(ValueError, match="last_node is in namespace 'a', key in None"):
        cache.cache_finished_req([1, 2, 3, 4], np.concatenate([hit.indices, own]), hit.last_node)
    with pytest.raises(ValueError, match="must be the start of key and kv_indices"):
        cache.cache_finished_req(RadixKey([1, 5, 3, 4], "a"), np.concatenate([hit.indices, own]), hit.last_node)
    with pytest.raises(ValueError, match="must be the start of key and kv_indices"):
        cache.cache_finished_req(RadixKey([1, 2, 3, 4], "a"), np.concatenate([own, hit.indices]), hit.last_node)
    assert (cache.total_size(), cache.protected_size(), cache.clock) == (2, 2, 4)
    assert cache.cache_finished_req(RadixKey([1, 2, 3, 4], "a"), np.concatenate([hit.indices, own]),
                                    hit.last_node, priority=5) == 0
    assert cache.snapshot().select("first_tokens", "priority", "evictable").rows()[1:] == [
        ("a:[1 2]", 5, False), ("a:[3]", 5, True)]  # evictable = an unlocked leaf (a candidate now)


# ----- slot ownership, atomic eviction, int64 token ids -----------------------------------

def test_insert_rejects_slots_the_tree_already_holds_under_another_key() -> None:
    cache = RadixCache(kv_pool_size=8)
    pool = cache.allocator
    slots = pool.alloc(4)
    assert cache.insert([1, 2, 3, 4], slots) == 0
    with pytest.raises(ValueError, match=r"value holds slots \[1, 2, 3, 4\] that the tree already holds"):
        cache.insert([9, 9, 9, 9], slots)
    own = pool.alloc(2)  # [5, 6]
    with pytest.raises(ValueError, match=r"value holds slots \[4\] that the tree already holds"):
        cache.insert([1, 2, 7, 8], [1, 2, own[0], 4])  # new part [7 8] must not reuse the tree's slot 4
    with pytest.raises(ValueError, match=r"value must hold distinct slots allocated .* not allocated \[7\]"):
        cache.insert([5, 6], [own[0], 7])
    assert (cache.pretty(), cache.clock, pool.available_size()) == (
        "root #0 r=1\n  [1 2 3 4] #1 r=0 hit=1 t=3\ntokens 4: evictable 4, protected 0", 3, 2)
    # the matched part may carry the tree's own slots (cache_finished_req passes them)
    assert cache.insert([1, 2, 7, 8], [1, 2, *own]) == 2
    assert cache.tree_slots.owned().tolist() == [1, 2, 3, 4, 5, 6]
    assert cache.evict(100) == 6
    assert pool.free_slots().tolist() == [7, 8, 3, 4, 5, 6, 1, 2]
    assert cache.tree_slots.owned().tolist() == [] and cache.total_size() == 0


def test_finished_request_must_not_pass_the_trees_slots_as_its_own() -> None:
    cache = RadixCache(kv_pool_size=8)
    tree = cache.allocator.alloc(3)
    cache.insert([1, 2, 3], tree)
    # a request that matched nothing (root) claims the tree's slots as its own KV
    with pytest.raises(ValueError, match=r"kv_indices holds slots \[1, 2, 3\] that the tree already holds"):
        cache.cache_finished_req([1, 2, 3, 4], tree, cache.root)
    assert cache.allocator.available_size() == 5 and cache.tree_slots.owned().tolist() == [1, 2, 3]
    assert cache.match_prefix([1, 2, 3]).indices.tolist() == [1, 2, 3]


def test_evict_and_reset_check_every_slot_before_freeing_any() -> None:
    cache = RadixCache(kv_pool_size=8, enable_kv_cache_events=True)
    cache.insert([1, 2], cache.allocator.alloc(2))
    cache.insert([3, 4], cache.allocator.alloc(2))
    cache.take_events()
    cache.match_prefix([3, 4]).last_node.value = np.array([1, 4])  # corrupt: slot 1 in two nodes
    state = (cache.pretty(), cache.allocator.free_slots().tolist(), cache.evictable_size())
    with pytest.raises(RuntimeError, match=r"evict would free slots \[1, 2, 1, 4\] .* indicates a bug"):
        cache.evict(100)
    with pytest.raises(RuntimeError, match=r"reset would free slots \[1, 2, 1, 4\] .* indicates a bug"):
        cache.reset()
    assert (cache.pretty(), cache.allocator.free_slots().tolist(), cache.evictable_size()) == state
    assert cache.take_events() == []


BIG = 2**63 + 5


def test_token_ids_must_fit_int64() -> None:
    cache = RadixCache()
    message = r"key token ids must be < 2\*\*63 \(SGLang token ids are int64\), got 9223372036854775813"
    for call in (lambda: cache.insert([1, BIG]), lambda: cache.match_prefix([BIG]),
                 lambda: cache.insert(RadixKey([BIG], "a"), [3]),
                 lambda: cache.cache_finished_req([1, BIG], [1], cache.root)):
        with pytest.raises(ValueError, match=message):
            call()
    assert (cache.clock, cache.total_size()) == (1, 0)
    assert cache.insert([2**63 - 1]) == 0
    assert cache.match_prefix([2**63 - 1]).indices.tolist() == [2**63 - 1]


def test_a_key_shorter_than_a_page_inserts_nothing_but_ticks_and_stamps_the_root() -> None:
    cache = RadixCache(page_size=4)
    cache.insert([1, 2, 3, 4])
    assert cache.insert([1, 2, 3], priority=7) == 0
    assert cache.clock == 4 and cache.snapshot().select("first_tokens", "last_access_time", "priority").rows() == [
        ("[]", 4, 7), ("[1 2 3 4]", 3, 0)]
