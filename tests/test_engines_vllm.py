"""vLLM v1 block pool and KV cache manager: golden scenarios (docs/specs/engines.md §1.3),
bug-report cases, events, dumps — exact block ids. Fork / copy-on-write and elastic growth
(oMLX's) are in test_engines_omlx.py."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from kvlab.engines.vllm.block_pool import BlockPool
from kvlab.engines.vllm.kv_cache_manager import KVCacheManager
from kvlab.engines.vllm.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock
from kvlab.engines.vllm.request import Request
from kvlab.engines.vllm.stats import PrefixCacheStats
from kvlab.events.types import AllBlocksCleared, BlockRemoved, BlockStored
from kvlab.hashing import RequestExtras, sim, vllm

HASHER4 = vllm(block_size=4)


def make_manager(num_blocks: int, *, block_size: int = 4, free_order: str = "current", events: bool = False,
                 caching: bool = True) -> KVCacheManager:
    pool = BlockPool(num_blocks, block_size=block_size, free_order=free_order, enable_kv_cache_events=events,
                     enable_caching=caching)
    return KVCacheManager(pool, block_size=block_size, enable_caching=caching)


def queue_ids(manager: KVCacheManager) -> list[int]:
    return [b.block_id for b in manager.block_pool.free_block_queue.get_all_free_blocks()]


def ids(blocks: list[KVCacheBlock] | None) -> list[int] | None:
    return None if blocks is None else [b.block_id for b in blocks]


def admit(manager: KVCacheManager, request: Request, budget: int | None = None) -> list[int] | None:
    """Lookup + allocate as the scheduler does; the new block ids, or None when rejected."""
    hits, num_hit_tokens = manager.get_computed_blocks(request)
    todo = request.num_tokens - num_hit_tokens
    return ids(manager.allocate_slots(request, todo if budget is None else min(budget, todo), num_hit_tokens, hits))


def removed_keys(manager: KVCacheManager) -> list[int]:
    return [k for e in manager.take_events() if isinstance(e, BlockRemoved) for k in e.block_hashes]


# ---------------------------------------------------------------- golden scenarios §1.3


@pytest.mark.parametrize(("free_order", "queue", "allocated", "evicted_block"), [
    ("classic", [8, 9, 10, 5, 4, 3, 7, 6, 2, 1], [8, 9, 10, 5, 4], 4),
    ("current", [7, 5, 8, 9, 10, 4, 3, 6, 2, 1], [7, 5, 8, 9, 10], None),
])
def test_scenario1_design_doc_example(free_order, queue, allocated, evicted_block) -> None:
    """The design doc's ids plus 1 (block 0 is the null block): 11 blocks, block size 4."""
    manager = make_manager(11, free_order=free_order, events=True)
    r0 = Request.from_tokens("r0", range(100, 118), HASHER4)  # 4 full blocks + 2 tokens
    r1 = Request.from_tokens("r1", [*range(100, 108), *range(200, 206)], HASHER4)  # shares 2 blocks
    assert admit(manager, r0) == [1, 2, 3, 4, 5]
    assert admit(manager, r1) == [6, 7]
    assert manager.get_block_ids("r1") == [1, 2, 6, 7]
    manager.free(r0)
    manager.free(r1)
    assert queue_ids(manager) == queue
    manager.take_events()
    r2 = Request.from_tokens("r2", [*range(100, 112), *range(300, 317)], HASHER4)  # 29 tokens, 12 shared
    hits, num_hit_tokens = manager.get_computed_blocks(r2)
    assert (ids(hits), num_hit_tokens) == ([1, 2, 3], 12)
    assert ids(manager.allocate_slots(r2, 17, 12, hits)) == allocated
    expected = [] if evicted_block is None else [r0.block_hashes[evicted_block - 1]]
    assert removed_keys(manager) == expected


@pytest.mark.parametrize("free_order", ["classic", "current"])
def test_scenario2_reverse_free_keeps_chains_whole(free_order) -> None:
    manager = make_manager(4, free_order=free_order, events=True)  # 3 usable blocks
    first = Request.from_block_keys("first", 12, [1, 2, 3])
    assert admit(manager, first) == [1, 2, 3]
    manager.free(first)
    assert queue_ids(manager) == [3, 2, 1]
    manager.take_events()
    assert admit(manager, Request.from_block_keys("other", 3, [])) == [3]
    assert removed_keys(manager) == [3]  # the chain's tail goes first, always
    hits, num_hit_tokens = manager.get_computed_blocks(Request.from_block_keys("again", 13, [1, 2, 3]))
    assert (ids(hits), num_hit_tokens) == ([1, 2], 8)


def test_scenario3_last_token_rule() -> None:
    hasher = vllm(block_size=16)
    manager = make_manager(4, block_size=16)
    tokens = list(range(1000, 1033))
    warm = Request.from_tokens("warm", tokens, hasher)
    assert admit(manager, warm) == [1, 2, 3]
    manager.free(warm)
    r32 = Request.from_tokens("r32", tokens[:32], hasher)
    hits, num_hit_tokens = manager.get_computed_blocks(r32)
    assert (ids(hits), num_hit_tokens) == ([1], 16)  # block 2 is cached too, but recomputed
    assert manager.get_computed_blocks(Request.from_tokens("r33", tokens, hasher))[1] == 32
    assert ids(manager.allocate_slots(r32, 16, 16, hits)) == [3]  # the whole last block is recomputed


def test_scenario4_capacity_counts_evictable_hits() -> None:
    manager = make_manager(5, events=True)  # 4 usable blocks
    pool = manager.block_pool
    warm = Request.from_block_keys("warm", 16, [1, 2, 3, 4])
    assert admit(manager, warm) == [1, 2, 3, 4]
    manager.free(warm)
    manager.take_events()
    before, queue_before = pool.snapshot(), queue_ids(manager)
    stats_before = PrefixCacheStats(**vars(manager.prefix_cache_stats))
    wide = Request.from_block_keys("wide", 20, [1, 2, 3, 7, 8])  # 3 hits + 2 new = 5 > 4 free
    hits, num_hit_tokens = manager.get_computed_blocks(wide)
    assert (ids(hits), num_hit_tokens) == ([1, 2, 3], 12)
    assert manager.allocate_slots(wide, 8, 12, hits) is None
    assert_frame_equal(pool.snapshot(), before)
    assert queue_ids(manager) == queue_before == [4, 3, 2, 1]
    assert manager.prefix_cache_stats == stats_before and manager.take_events() == []
    assert wide.num_computed_tokens == 0 and manager.get_block_ids("wide") == []
    narrow = Request.from_block_keys("narrow", 16, [1, 2, 3, 7])  # 3 hits + 1 new = 4: fits
    assert admit(manager, narrow) == [4]
    assert removed_keys(manager) == [4]


# ---------------------------------------------------------------- bug-report cases


@pytest.mark.parametrize(("free_order", "hit_a", "hit_b", "hits_at_admission"),
                         [("current", 4, 4, 8), ("classic", 0, 4, 0)])
def test_bug1_partial_blocks_do_not_flush_cache_entries(free_order, hit_a, hit_b, hits_at_admission) -> None:
    """5 blocks = null + 4 usable, B=4. In current order the partial blocks are reused
    first, so A0 and B0 survive R_C; in classic order R_C evicts A0, and re-sent R_A then
    evicts B0 before R_B comes back."""
    manager = make_manager(5, free_order=free_order)
    r_a = Request.from_tokens("a", range(1, 7), HASHER4)
    r_b = Request.from_tokens("b", range(21, 27), HASHER4)
    assert admit(manager, r_a) == [1, 2]
    manager.free(r_a)
    assert admit(manager, r_b) == ([2, 3] if free_order == "current" else [3, 4])
    manager.free(r_b)
    r_c = Request.from_tokens("c", range(41, 48), HASHER4)
    assert admit(manager, r_c) == ([3, 4] if free_order == "current" else [2, 1])
    for request, hit in ((r_a, hit_a), (r_b, hit_b)):
        again = Request.from_tokens(f"{request.request_id}-again", request.token_ids, HASHER4)
        assert manager.get_computed_blocks(again)[1] == hit
    manager.free(r_c)
    for name, tokens in (("a2", range(1, 7)), ("b2", range(21, 27))):
        assert admit(manager, Request.from_tokens(name, tokens, HASHER4)) is not None
    stats = manager.make_prefix_cache_stats()
    assert (stats.requests, stats.queries, stats.hits) == (5, 31, hits_at_admission)


def test_bug2_cached_free_blocks_count_as_free() -> None:
    manager = make_manager(9, events=True)  # 8 usable blocks
    pool = manager.block_pool
    usages = []
    small = Request.from_block_keys("small", 8, [1, 2])
    assert admit(manager, small) == [1, 2]
    usages.append(pool.get_usage())
    manager.free(small)
    usages.append(pool.get_usage())
    counts = dict(pool.snapshot().group_by("state").len().iter_rows())
    assert counts == {"null": 1, "cached_free": 2, "free": 6}
    manager.take_events()
    big = Request.from_block_keys("big", 32, list(range(11, 19)))
    assert admit(manager, big) == [3, 4, 5, 6, 7, 8, 2, 1]
    usages.append(pool.get_usage())
    assert removed_keys(manager) == [2, 1]
    assert usages == [0.25, 0.0, 1.0]


def test_bug4_shared_block_not_reallocated_until_released() -> None:
    manager = make_manager(5)
    pool = manager.block_pool
    seq = Request.from_block_keys("seq", 6, [1])
    entry = Request.from_block_keys("entry", 5, [1])  # plays the cache's reference
    assert admit(manager, seq) == [1, 2]
    assert admit(manager, entry) == [3]
    block = pool.blocks[1]
    assert block.ref_cnt == 2
    assert pool.evict_blocks([1]) == [1]
    assert (block.ref_cnt, block.block_hash, pool.get_cached_block(1)) == (2, None, None)
    manager.free(entry)
    assert block.ref_cnt == 1 and queue_ids(manager) == [3, 4]
    filler = Request.from_block_keys("filler", 12, [5, 6, 7])
    assert admit(manager, filler) is None  # block 1 is not available
    assert admit(manager, Request.from_block_keys("fill2", 8, [5, 6])) == [3, 4]
    manager.free(seq)
    assert queue_ids(manager) == [2, 1]
    assert admit(manager, Request.from_block_keys("next", 1, [])) == [2]


def test_bug6_duplicate_copy_survives_eviction_of_the_first() -> None:
    manager = make_manager(7, events=True)
    pool = manager.block_pool
    r1 = Request.from_tokens("r1", [1, 2, 3, 4, 7], HASHER4)
    r2 = Request.from_tokens("r2", [1, 2, 3, 4, 8], HASHER4)
    key = r1.block_hashes[0]
    assert r2.block_hashes == [key]
    lookups = [manager.get_computed_blocks(r) for r in (r1, r2)]  # both miss: same step
    assert [hit for _, hit in lookups] == [0, 0]
    assert ids(manager.allocate_slots(r1, 5, 0, lookups[0][0])) == [1, 2]
    assert ids(manager.allocate_slots(r2, 5, 0, lookups[1][0])) == [3, 4]
    assert list(pool.cached_block_hash_to_block[key]) == [1, 3]  # no de-duplication (V8)
    assert pool.get_cached_block(key).block_id == 1
    manager.free(r1)
    manager.take_events()
    assert pool.evict_blocks([1]) == [1]
    assert removed_keys(manager) == [key]  # published although block 3 still holds it
    probe = Request.from_tokens("probe", [1, 2, 3, 4, 9], HASHER4)
    hits, num_hit_tokens = manager.get_computed_blocks(probe)
    assert (ids(hits), num_hit_tokens) == ([3], 4)


def test_bug7_mixed_group_block_sizes_rejected() -> None:
    pool = BlockPool(8, block_size=4)
    with pytest.raises(ValueError, match=r"LCM \(16 tokens\), so a prompt of 16 tokens or fewer could never hit"):
        KVCacheManager(pool, block_size=4, group_block_sizes={4, 16})
    with pytest.raises(ValueError, match=r"group_block_sizes must hold block_size \(4\) only, got \[8\]"):
        KVCacheManager(pool, block_size=4, group_block_sizes=[8, 8])
    assert KVCacheManager(pool, block_size=4, group_block_sizes=[4, 4]).block_size == 4


def test_bug8_preempted_request_hits_counted_apart() -> None:
    manager = make_manager(9)
    request = Request.from_tokens("r", range(13), HASHER4)
    assert admit(manager, request) == [1, 2, 3, 4]
    manager.preempt(request)
    assert (request.num_computed_tokens, request.num_preemptions) == (0, 1)
    assert manager.get_block_ids("r") == [] and queue_ids(manager) == [4, 5, 6, 7, 8, 3, 2, 1]
    assert admit(manager, request) == [4]  # hits its own 3 blocks, recomputes the last token
    other = Request.from_tokens("s", range(13), HASHER4)
    assert admit(manager, other) == [5]
    stats = manager.make_prefix_cache_stats()
    assert (stats.requests, stats.queries, stats.hits) == (2, 26, 12)
    assert (stats.preempted_requests, stats.preempted_queries, stats.preempted_hits) == (1, 13, 12)
    assert stats.hit_rate == 12 / 26
    assert manager.prefix_cache_stats == PrefixCacheStats()


def test_bug8_chunked_prefill_recorded_once() -> None:
    manager = make_manager(6, events=True)
    request = Request.from_tokens("r", range(20), HASHER4)
    blocker = Request.from_block_keys("blocker", 20, [91, 92, 93, 94, 95])
    assert admit(manager, blocker) == [1, 2, 3, 4, 5]
    assert admit(manager, request, budget=8) is None  # retried while waiting: not counted
    assert admit(manager, request, budget=8) is None
    manager.free(blocker)
    manager.make_prefix_cache_stats()
    manager.take_events()
    steps = [admit(manager, request, budget=8)]
    steps += [ids(manager.allocate_slots(request, n)) for n in (8, 4)]
    assert steps == [[5, 4], [3, 2], [1]]  # the blocker's chain, evicted tail first
    stats = manager.make_prefix_cache_stats()
    assert (stats.requests, stats.queries, stats.hits) == (1, 20, 0)
    stored = [(e.block_hashes, e.parent_block_hash, len(e.token_ids)) for e in manager.take_events()
              if isinstance(e, BlockStored)]
    k = request.block_hashes
    assert stored == [((k[0], k[1]), None, 8), ((k[2], k[3]), k[1], 8), ((k[4],), k[3], 4)]


# ---------------------------------------------------------------- free orders, reset, events


@pytest.mark.parametrize(("free_order", "queue"), [("current", [3, 2, 1, 4, 5]), ("classic", [4, 5, 3, 2, 1])])
def test_caching_disabled_free_order(free_order, queue) -> None:
    """Current vLLM reuses LIFO with caching off (PR #51482); classic appended everything."""
    manager = make_manager(6, caching=False, free_order=free_order)
    request = Request.from_block_keys("r", 12, [1, 2, 3])
    assert manager.get_computed_blocks(request) == ([], 0)
    assert admit(manager, request) == [1, 2, 3]
    assert all(b.block_hash is None for b in manager.block_pool.blocks)
    manager.free(request)
    assert queue_ids(manager) == queue
    assert manager.make_prefix_cache_stats() == PrefixCacheStats()  # nothing recorded with caching off


def test_reset_prefix_cache_refuses_while_blocks_in_use() -> None:
    manager = make_manager(5, events=True)
    pool = manager.block_pool
    request = Request.from_block_keys("r", 9, [1, 2])
    admit(manager, request)
    manager.take_events()
    assert manager.reset_prefix_cache() is False
    assert list(pool.cached_block_hash_to_block) == [1, 2] and manager.take_events() == []
    assert manager.prefix_cache_stats.reset is False
    manager.free(request)
    assert manager.reset_prefix_cache() is True
    assert pool.cached_block_hash_to_block == {} and all(b.block_hash is None for b in pool.blocks)
    assert manager.take_events() == [AllBlocksCleared()]
    assert manager.make_prefix_cache_stats().reset is True
    assert queue_ids(manager) == [3, 4, 2, 1]  # order kept
    assert manager.get_computed_blocks(Request.from_block_keys("again", 9, [1, 2])) == ([], 0)


def test_events_stored_with_parent_and_removed_on_lazy_eviction() -> None:
    manager = make_manager(4, events=True)
    a = Request.from_tokens("a", range(9), HASHER4)
    assert admit(manager, a) == [1, 2, 3]
    (stored,) = manager.take_events()
    assert stored == BlockStored(block_hashes=a.block_hashes, parent_block_hash=None, token_ids=list(range(8)),
                                 block_size=4, lora_id=None, medium="GPU", lora_name=None, extra_keys=[None, None],
                                 group_idx=0, kv_cache_spec_kind="full_attention")
    manager.free(a)
    b = Request.from_block_keys("b", 12, [1, 2, 3])  # keys only: events carry no tokens
    assert admit(manager, b) == [3, 2, 1]
    events = manager.take_events()
    assert events == [BlockRemoved([a.block_hashes[1]], medium="GPU", group_idx=0),
                      BlockRemoved([a.block_hashes[0]], medium="GPU", group_idx=0),
                      BlockStored(block_hashes=[1, 2, 3], parent_block_hash=None, token_ids=[], block_size=4,
                                  lora_id=None, medium="GPU", lora_name=None, extra_keys=[None, None, None],
                                  group_idx=0, kv_cache_spec_kind="full_attention")]
    assert events[-1].token_ids == ()  # as Request.from_block_keys documents
    quiet = make_manager(4)
    admit(quiet, Request.from_block_keys("q", 8, [1, 2]))
    assert quiet.take_events() == []


# ---------------------------------------------------------------- dumps


def dump_state() -> KVCacheManager:
    manager = make_manager(6)
    done = Request.from_block_keys("done", 6, [0xA])
    assert admit(manager, done) == [1, 2]
    manager.free(done)
    assert admit(manager, Request.from_block_keys("run", 5, [0xB])) == [2, 3]
    return manager


def test_pretty_dump() -> None:
    assert dump_state().block_pool.pretty() == "\n".join([
        "BlockPool(num_blocks=6, in_use=2, free=3, cached=2, free_order='current', caching=True)",
        "usage 0.40",
        "  id  state        ref  hash",
        "   0  null           0  -",
        "   1  cached_free    0  0xa",
        "   2  in_use         1  0xb",
        "   3  in_use         1  -",
        "   4  free           0  -",
        "   5  free           0  -",
        "free queue (head -> tail): 4 5 1",
        "hash map: 0xa -> [1]; 0xb -> [2]",
    ])


def test_snapshot_frame() -> None:
    expected = pl.DataFrame({
        "block_id": [0, 1, 2, 3, 4, 5],
        "state": ["null", "cached_free", "in_use", "in_use", "free", "free"],
        "ref_cnt": [0, 0, 1, 1, 0, 0],
        "block_hash": [None, 0xA, 0xB, None, None, None],
        "queue_position": [None, 2, None, None, 0, 1],
    }, schema={"block_id": pl.Int64, "state": pl.String, "ref_cnt": pl.Int64, "block_hash": pl.UInt64,
               "queue_position": pl.Int64})
    assert_frame_equal(dump_state().block_pool.snapshot(), expected)


def test_repr_is_concise() -> None:
    manager = dump_state()
    assert repr(manager).startswith("KVCacheManager(block_size=4, running=1, caching=True, pool=BlockPool(")
    assert repr(manager.block_pool.free_block_queue) == "FreeKVCacheBlockQueue(num_free_blocks=3, head->tail: 4 5 1)"


def test_snapshot_keeps_full_u64_keys() -> None:
    manager = make_manager(3)
    admit(manager, Request.from_block_keys("r", 5, [2**64 - 1]))
    assert manager.block_pool.snapshot()["block_hash"].to_list() == [None, 2**64 - 1, None]


# ---------------------------------------------------------------- free queue guard (hard point #11)


def test_free_queue_guards_against_corruption() -> None:
    blocks = [KVCacheBlock(i) for i in range(4)]
    queue = FreeKVCacheBlockQueue(blocks)
    with pytest.raises(RuntimeError, match="block 2 is already in the free queue"):
        queue.append(blocks[2])
    with pytest.raises(RuntimeError, match="block 2 is already in the free queue"):
        queue.prepend_n([blocks[2]])
    taken = queue.popleft_n(2)
    with pytest.raises(RuntimeError, match="block 1 is already in the free queue"):
        queue.append_n([taken[1], taken[1]])  # listed twice: nothing linked
    with pytest.raises(RuntimeError, match="block 0 is not in the free queue"):
        queue.remove(taken[0])
    taken[0].is_null = True
    with pytest.raises(RuntimeError, match="block 0 is the null block"):
        queue.prepend_n([taken[1], taken[0]])
    assert [b.block_id for b in queue.get_all_free_blocks()] == [2, 3] and queue.num_free_blocks == 2
    queue.remove(blocks[3])
    queue.prepend_n([taken[1]])
    queue.append_n([blocks[3]])
    assert [b.block_id for b in queue.get_all_free_blocks()] == [1, 2, 3]
    assert [b.in_free_queue for b in blocks] == [False, True, True, True]
    with pytest.raises(ValueError, match="n=4 exceeds the 3 free blocks"):
        queue.popleft_n(4)
    queue.popleft_n(3)
    with pytest.raises(ValueError, match="no free blocks available"):
        queue.popleft()


# ---------------------------------------------------------------- caller mistakes


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_blocks": 0}, "num_blocks must be an integer >= 1, got 0"),
    ({"num_blocks": -1}, "num_blocks must be an integer >= 1, got -1"),
    ({"num_blocks": 2.0}, "num_blocks must be an integer >= 1, got 2.0"),
    ({"num_blocks": 2**31}, r"num_blocks must be below 2\*\*31, got 2147483648"),
    ({"enable_kv_cache_events": "yes"}, "enable_kv_cache_events must be a bool, got 'yes'"),
    ({"free_order": "lru"}, "free_order must be one of"),
    ({"enable_caching": 1}, "enable_caching must be a bool, got 1"),
    ({"block_size": 0}, "block_size must be an integer >= 1, got 0"),
])
def test_pool_rejects_bad_arguments(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        BlockPool(**{"num_blocks": 4, **kwargs})


def test_pool_rejects_bad_calls_and_changes_nothing() -> None:
    manager = make_manager(5)
    pool = manager.block_pool
    request = Request.from_block_keys("r", 6, [7])
    admit(manager, request)
    before = pool.snapshot()
    with pytest.raises(ValueError, match="lists block 1 2 time"):
        pool.free_blocks([pool.blocks[1], pool.blocks[1]])
    with pytest.raises(ValueError, match=r"block_ids has 5, but the pool has blocks 0..4"):
        pool.evict_blocks([1, 5])
    with pytest.raises(ValueError, match=r"cannot get 3 free blocks from the pool: 2 free"):
        pool.get_new_blocks(3)
    with pytest.raises(ValueError, match=r"block_hash must be a u64 block key .* got -1"):
        pool.get_cached_block(-1)
    table = [pool.blocks[i] for i in manager.get_block_ids("r")]
    for blocks, problem in (([pool.null_block], "is the null block"), ([pool.blocks[3]], r"is free \(ref_cnt 0\)"),
                            (table, "already holds hash 0x7")):
        with pytest.raises(ValueError, match=problem):
            pool.cache_full_blocks(blocks, [7], 0, 1)
    with pytest.raises(ValueError, match="num_full_blocks=2 exceeds len"):
        pool.cache_full_blocks(table, [7], 1, 2)
    with pytest.raises(ValueError, match="token_ids has 3 tokens, fewer than"):
        pool.cache_full_blocks(table[1:], [7], 0, 1, token_ids=[1, 2, 3])
    assert_frame_equal(pool.snapshot(), before)
    with pytest.raises(ValueError, match="cache_full_blocks needs enable_caching=True"):
        BlockPool(3, enable_caching=False).cache_full_blocks([], [], 0, 0)


def test_request_checks() -> None:
    request = Request.from_tokens("r", range(10), sim(block_size=4, partial_tail=True))
    assert len(request.block_hashes) == 2  # the partial-tail key is dropped
    with pytest.raises(ValueError, match=r"hasher must be a kvlab\.hashing BlockHasher"):
        Request.from_tokens("r", [1], hasher=object())
    with pytest.raises(ValueError, match="num_tokens must be an integer >= 1, got 0"):
        Request.from_tokens("r", [], HASHER4)
    with pytest.raises(ValueError, match="num_tokens must be an integer >= 1, got -2"):
        Request.from_block_keys("r", -2, [])
    with pytest.raises(ValueError, match="num_new_tokens must be an integer >= 1, got 0"):
        Request.from_block_keys("k", 3, []).append_block_keys(0)
    with pytest.raises(ValueError, match=r"block_hashes\[1\] must be a u64 block key"):
        Request.from_block_keys("r", 8, [1, 2**64])
    with pytest.raises(ValueError, match="use append_block_keys"):
        Request.from_block_keys("k", 3, []).append_tokens([1])
    with pytest.raises(ValueError, match="use append_tokens"):
        request.append_block_keys(1)
    with pytest.raises(ValueError, match="token_ids must not be empty"):
        request.append_tokens([])
    with pytest.raises(ValueError, match="num_computed_tokens must be <= num_tokens"):
        Request("r", 3, [], num_computed_tokens=4)
    with pytest.raises(ValueError, match="block_hashes has 1 keys but 9 tokens make 2 full blocks of 4"):
        Request("r", 9, [1], block_size=4)
    with pytest.raises(ValueError, match="token_ids has 2 tokens but num_tokens is 3"):
        Request("r", 3, [], token_ids=[1, 2])
    request.append_tokens([10, 11])
    assert (request.num_tokens, len(request.block_hashes)) == (12, 3)


def test_extras_reach_the_hasher() -> None:
    """A LoRA adapter changes every key, so the same tokens under another adapter miss."""
    manager = make_manager(6)
    base = Request.from_tokens("base", range(9), HASHER4)
    assert admit(manager, base) == [1, 2, 3]
    lora = Request.from_tokens("lora", range(9), HASHER4, RequestExtras(lora_name="ad"), lora_id=1)
    assert set(lora.block_hashes).isdisjoint(base.block_hashes)
    assert manager.get_computed_blocks(lora) == ([], 0)
    lora.append_tokens(range(9, 12))  # completes a block: keys still carry the adapter
    assert lora.block_hashes == Request.from_tokens("x", range(12), HASHER4, RequestExtras(lora_name="ad"),
                                                  lora_id=1).block_hashes


def test_pool_with_only_the_null_block() -> None:
    pool = BlockPool(1)
    assert (pool.get_usage(), pool.get_num_free_blocks(), pool.null_block.is_null) == (0.0, 0, True)
    assert pool.get_new_blocks(0) == []
    with pytest.raises(ValueError, match="cannot get 1 free blocks from the pool: 0 free"):
        pool.get_new_blocks(1)


def test_manager_checks_request_and_arguments() -> None:
    manager = make_manager(6)
    with pytest.raises(ValueError, match="hashed with block_size 16 but the manager's block_size is 4"):
        manager.get_computed_blocks(Request.from_tokens("r", range(20), vllm(block_size=16)))
    with pytest.raises(ValueError, match="has 1 block keys but its 9 tokens make 2 full blocks of 4"):
        manager.allocate_slots(Request.from_block_keys("r", 9, [1]), 9)
    request = Request.from_block_keys("r", 9, [1, 2])
    for bad in (0, -3, 1.0):
        with pytest.raises(ValueError, match=f"num_new_tokens must be an integer >= 1, got {bad}"):
            manager.allocate_slots(request, bad)
    with pytest.raises(ValueError, match="goes past the end of request 'r'"):
        manager.allocate_slots(request, 10)
    with pytest.raises(ValueError, match="num_new_computed_tokens=4 but new_computed_blocks holds 0 blocks"):
        manager.allocate_slots(request, 1, 4)
    admit(manager, request, budget=4)
    with pytest.raises(ValueError, match="only a new request takes prefix hits"):
        manager.allocate_slots(request, 1, 4, [manager.block_pool.blocks[1]])
    manager.free(request)
    with pytest.raises(ValueError, match=r"has 4 computed tokens but no blocks \(freed\?\)"):
        manager.allocate_slots(request, 1)
    with pytest.raises(ValueError, match="only a running request can be preempted"):
        manager.preempt(request)
    with pytest.raises(ValueError, match="new_computed_blocks must be empty with caching disabled"):
        make_manager(4, caching=False).allocate_slots(Request.from_block_keys("x", 5, [1]), 1, 4,
                                                      [KVCacheBlock(1)])
    with pytest.raises(ValueError, match="block_size is 8 but the pool's block_size is 4"):
        KVCacheManager(BlockPool(4, block_size=4), block_size=8)
    with pytest.raises(ValueError, match="enable_caching is False but the pool's is True"):
        KVCacheManager(BlockPool(4, block_size=4), block_size=4, enable_caching=False)
    with pytest.raises(ValueError, match="pool must be a BlockPool"):
        KVCacheManager(object(), block_size=4)
    with pytest.raises(ValueError, match="request must be a Request"):
        manager.free("r")


def test_stats_record_checks() -> None:
    with pytest.raises(ValueError, match=r"num_hits must be <= num_tokens \(3\), got 4"):
        PrefixCacheStats().record(3, 4)
    assert PrefixCacheStats().hit_rate == 0.0


# ---------------------------------------------------------------- misuse that used to corrupt the model


def pool_with_two_in_use(**kwargs) -> BlockPool:
    """5 blocks: 1 and 2 in use (1 cached under key 7), 3 and 4 free."""
    pool = BlockPool(5, block_size=4, **kwargs)
    table = pool.get_new_blocks(2)
    pool.cache_full_blocks(table, [7], 0, 1)
    return pool


def frames(*pools: BlockPool) -> list[pl.DataFrame]:
    return [p.snapshot() for p in pools]


@pytest.mark.parametrize(("call", "message"), [
    (lambda pool, other: pool.touch([other.blocks[3]]),
     r"blocks\[0\] \(block 3\) is not a block of this BlockPool"),
    (lambda pool, other: pool.touch([pool.blocks[3], other.blocks[4]]),  # all or nothing: block 3 untouched
     r"blocks\[1\] \(block 4\) is not a block of this BlockPool"),
    (lambda pool, other: pool.touch([KVCacheBlock(3)]),  # an equal-looking block made by hand
     r"blocks\[0\] \(block 3\) is not a block of this BlockPool"),
    (lambda pool, other: pool.touch([KVCacheBlock(-1)]), r"blocks\[0\] \(block -1\) is not a block"),
    (lambda pool, other: pool.touch([other.null_block]), r"blocks\[0\] \(block 0\) is not a block"),
    (lambda pool, other: pool.touch([3]), r"blocks\[0\] must be a KVCacheBlock of this pool, got 3"),
    (lambda pool, other: pool.touch(None), "blocks must be an iterable of KVCacheBlock, got None"),
    (lambda pool, other: pool.free_blocks([other.blocks[1]]),
     r"ordered_blocks\[0\] \(block 1\) is not a block of this BlockPool"),
    (lambda pool, other: pool.free_blocks([pool.blocks[2], other.blocks[2]]),
     r"ordered_blocks\[1\] \(block 2\) is not a block of this BlockPool"),
    (lambda pool, other: pool.free_blocks([KVCacheBlock(9)]), r"ordered_blocks\[0\] \(block 9\) is not a block"),
    (lambda pool, other: pool.free_blocks([None]), r"ordered_blocks\[0\] must be a KVCacheBlock .* got None"),
    (lambda pool, other: pool.free_blocks(5), "ordered_blocks must be an iterable of KVCacheBlock, got 5"),
    (lambda pool, other: pool.cache_full_blocks([pool.blocks[1], other.blocks[2]], [7, 8], 1, 2),
     r"blocks\[1\] \(block 2\) is not a block of this BlockPool"),
    (lambda pool, other: pool.cache_full_blocks([1], [8], 0, 1), r"blocks\[0\] must be a KVCacheBlock .* got 1"),
    (lambda pool, other: pool.cache_full_blocks(None, [8], 0, 1), "blocks must be a sequence .* got None"),
    (lambda pool, other: pool.cache_full_blocks([pool.blocks[2]], 8, 0, 1), "block_hashes must be a sequence"),
    (lambda pool, other: pool.cache_full_blocks(pool.blocks[1:3], [7, 8], 2, 1),
     "num_cached_blocks=2 exceeds num_full_blocks=1"),
])
def test_foreign_or_bad_blocks_are_rejected_and_change_nothing(call, message) -> None:
    """Blocks of another pool used to be linked into this pool's queue (free count and
    usage off, the other pool's list broken) or cached in its map; non-blocks raised
    AttributeError / TypeError; counts out of order returned silently."""
    pool, other = pool_with_two_in_use(), pool_with_two_in_use()
    before = frames(pool, other)
    with pytest.raises(ValueError, match=message):
        call(pool, other)
    for after, expected in zip(frames(pool, other), before, strict=True):
        assert_frame_equal(after, expected)
    assert (pool.get_num_free_blocks(), pool.get_usage(), other.get_num_free_blocks()) == (2, 0.5, 2)


def test_own_blocks_still_pass_every_check() -> None:
    pool = pool_with_two_in_use()
    pool.touch([pool.null_block, pool.blocks[3]])
    pool.cache_full_blocks(pool.blocks[1:3], np.array([7, 8], dtype=np.uint64), 1, 2)
    pool.cache_full_blocks(pool.blocks[1:3], [7, 8], 2, 2)  # nothing new: a no-op
    pool.free_blocks(b for b in (pool.blocks[3], pool.blocks[2], pool.blocks[1], pool.null_block))
    assert [b.block_id for b in pool.free_block_queue.get_all_free_blocks()] == [3, 4, 2, 1]
    assert pool.get_cached_block(8).block_id == 2


def test_hits_must_be_the_requests_own_cached_blocks() -> None:
    """allocate_slots used to check only the number of hits: any block was touched and
    put in the table (the null block, another pool's, one twice, one with another key)."""
    manager = make_manager(6)
    pool = manager.block_pool
    first = Request.from_block_keys("a", 9, [0xA, 0xB])
    assert admit(manager, first) == [1, 2, 3]
    manager.free(first)  # queue 3 4 5 1 2: blocks 1, 2 cached and free
    request = Request.from_block_keys("b", 9, [0xA, 0xB])
    other = make_manager(6).block_pool
    before, stats = pool.snapshot(), vars(manager.prefix_cache_stats).copy()
    for hits, message in (
        ([pool.null_block], r"new_computed_blocks\[0\] \(block 0\) is the null block"),
        ([other.blocks[1]], r"new_computed_blocks\[0\] \(block 1\) is not a block of this BlockPool"),
        ([KVCacheBlock(1)], r"new_computed_blocks\[0\] \(block 1\) is not a block of this BlockPool"),
        ([None], r"new_computed_blocks\[0\] must be a KVCacheBlock of this pool, got None"),
        ([pool.blocks[1], pool.blocks[1]], r"new_computed_blocks\[1\] \(block 1\) is listed twice"),
        ([pool.blocks[2]], r"\[0\] \(block 2\) holds hash 0xb but block 0 of request 'b' has key 0xa"),
        ([pool.blocks[1], pool.blocks[3]], r"new_computed_blocks\[1\] \(block 3\) holds no hash but block 1"),
    ):
        with pytest.raises(ValueError, match=message):
            manager.allocate_slots(request, 1, 4 * len(hits), hits)
        assert_frame_equal(pool.snapshot(), before)
        assert vars(manager.prefix_cache_stats) == stats and request.num_computed_tokens == 0
    with pytest.raises(ValueError, match="new_computed_blocks must be an iterable of KVCacheBlock, got None"):
        manager.allocate_slots(request, 1, 0, None)
    hits, num_hit_tokens = manager.get_computed_blocks(request)
    assert ids(manager.allocate_slots(request, 1, num_hit_tokens, hits)) == [3]
    assert manager.get_block_ids("b") == [1, 2, 3]


def test_lookup_never_lists_a_block_twice() -> None:
    """Keys that are not chained may repeat; every copy of key 7 was block 1's to a lookup,
    so the hits listed it three times. The walk now ends at a repeated block."""
    manager = make_manager(8)
    first = Request.from_block_keys("a", 13, [7, 7, 7])
    assert admit(manager, first) == [1, 2, 3, 4]
    assert manager.block_pool.cached_block_hash_to_block[7].keys() == {1, 2, 3}  # no dedup (V8)
    manager.free(first)
    again = Request.from_block_keys("b", 13, [7, 7, 7])
    hits, num_hit_tokens = manager.get_computed_blocks(again)
    assert (ids(hits), num_hit_tokens) == ([1], 4)
    assert ids(manager.allocate_slots(again, 9, num_hit_tokens, hits)) == [4, 5, 6]
    assert [manager.block_pool.blocks[i].ref_cnt for i in range(1, 8)] == [1, 0, 0, 1, 1, 1, 0]


def test_request_id_belongs_to_one_live_request() -> None:
    """Block tables are keyed by id: a second Request with a running id used to hit an
    "out of step" assertion (silent sharing under python -O), or free / preempt the first
    request's blocks (fork: test_engines_omlx.py)."""
    manager = make_manager(8)
    first = Request.from_block_keys("a", 6, [0xA])
    assert admit(manager, first) == [1, 2]
    impostor = Request.from_block_keys("a", 6, [0xA])
    before = manager.block_pool.snapshot()
    message = "request id 'a' is already in use by another request"
    for call in (lambda: manager.allocate_slots(impostor, 6), lambda: admit(manager, impostor),
                 lambda: manager.free(impostor), lambda: manager.preempt(impostor)):
        with pytest.raises(ValueError, match=message):
            call()
        assert_frame_equal(manager.block_pool.snapshot(), before)
        assert manager.get_block_ids("a") == [1, 2] and impostor.num_computed_tokens == 0
    manager.free(first)  # the id is free again
    assert admit(manager, impostor) == [2]
    with pytest.raises(ValueError, match=message):
        manager.free(first)
    manager.preempt(impostor)  # preemption releases the id too
    third = Request.from_block_keys("a", 6, [0xA])
    assert admit(manager, third) == [2]
    with pytest.raises(ValueError, match=message):
        manager.allocate_slots(impostor, 2, 4, [manager.block_pool.blocks[1]])
    assert manager.get_block_ids("a") == [1, 2]


def test_computed_tokens_changed_outside_the_manager() -> None:
    manager = make_manager(6)
    request = Request.from_block_keys("r", 9, [1, 2])
    admit(manager, request, budget=4)
    request.num_computed_tokens = 8
    with pytest.raises(ValueError, match=r"request 'r' has 8 computed tokens but its table holds 1 blocks of 4"):
        manager.allocate_slots(request, 1)


def test_enable_caching_is_compared_by_value() -> None:
    """The manager compared flags by identity: np.True_ was 'not' the pool's True."""
    manager = KVCacheManager(BlockPool(4, block_size=4), block_size=4, enable_caching=np.True_)
    assert manager.enable_caching is True
    pool = BlockPool(4, block_size=4, enable_caching=np.False_, enable_kv_cache_events=np.True_)
    assert (pool.enable_caching, pool.enable_kv_cache_events) == (False, True)
    assert KVCacheManager(pool, block_size=4, enable_caching=False).enable_caching is False
    with pytest.raises(ValueError, match="enable_caching is False but the pool's is True"):
        KVCacheManager(BlockPool(4, block_size=4), block_size=4, enable_caching=np.False_)
    with pytest.raises(ValueError, match="enable_caching must be a bool, got 1"):
        KVCacheManager(BlockPool(4, block_size=4), block_size=4, enable_caching=1)
