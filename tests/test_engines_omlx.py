"""oMLX's paged cache (kvlab.engines.omlx): fork / copy-on-write, elastic growth, shared
prefixes, ref-count statistics, cold blocks and the paged-SSD-only mode — exact block ids,
ref counts and SSD eviction order — and its differential against the vLLM engine."""

from __future__ import annotations

import pytest
from polars.testing import assert_frame_equal
from test_engines_vllm import HASHER4, admit, ids, queue_ids, removed_keys

from kvlab.engines.omlx.paged_cache import PagedBlockPool, PagedCacheManager
from kvlab.engines.omlx.paged_ssd_cache import PagedSSDCache
from kvlab.engines.vllm.request import Request


def make_manager(num_blocks: int, *, block_size: int = 4, free_order: str = "current", events: bool = False,
                 caching: bool = True, max_blocks: int | None = None, ssd: PagedSSDCache | None = None,
                 ) -> PagedCacheManager:
    pool = PagedBlockPool(num_blocks, block_size=block_size, free_order=free_order, enable_kv_cache_events=events,
                          enable_caching=caching, max_blocks=max_blocks)
    return PagedCacheManager(pool, block_size=block_size, enable_caching=caching, ssd=ssd)


# ---------------------------------------------------------------- fork / copy-on-write


def test_fork_shares_blocks_and_copies_on_write() -> None:
    manager = make_manager(6)
    pool = manager.block_pool
    parent = Request.from_tokens("p", [1, 2, 3, 4, 5, 6], HASHER4)
    assert admit(manager, parent) == [1, 2]
    child = manager.fork(parent, "c")
    assert (child.request_id, child.num_computed_tokens, child.token_ids) == ("c", 6, parent.token_ids)
    assert manager.get_block_ids("c") == [1, 2] and [b.ref_cnt for b in pool.blocks[1:3]] == [2, 2]
    child.append_tokens([7])
    assert ids(manager.allocate_slots(child, 1)) == [3]  # the copy of shared partial block 2
    assert manager.get_block_ids("c") == [1, 3] and manager.get_block_ids("p") == [1, 2]
    assert [b.ref_cnt for b in pool.blocks[1:4]] == [2, 1, 1]
    parent.append_tokens([8, 9, 10])
    assert ids(manager.allocate_slots(parent, 3)) == [4]  # block 2 is private again: written in place
    assert manager.get_block_ids("p") == [1, 2, 4]
    assert pool.blocks[2].block_hash == parent.block_hashes[1]
    child.append_tokens([11, 12])
    assert ids(manager.allocate_slots(child, 2)) == [5]
    assert pool.blocks[3].block_hash == child.block_hashes[1] != parent.block_hashes[1]
    manager.free(parent)
    manager.free(child)
    assert queue_ids(manager) == [5, 4, 2, 3, 1]


def test_fork_with_full_last_block_needs_no_copy() -> None:
    manager = make_manager(5)
    parent = Request.from_block_keys("p", 8, [1, 2])
    assert admit(manager, parent) == [1, 2]
    child = manager.fork(parent, "c")
    child.append_block_keys(1)
    assert ids(manager.allocate_slots(child, 1)) == [3]
    assert manager.get_block_ids("c") == [1, 2, 3]


def test_copy_on_write_counts_toward_capacity() -> None:
    manager = make_manager(4)
    parent = Request.from_block_keys("p", 6, [1])
    assert admit(manager, parent) == [1, 2]
    child = manager.fork(parent, "c")
    assert admit(manager, Request.from_block_keys("x", 1, [])) == [3]
    before = manager.block_pool.snapshot()
    child.append_block_keys(1)
    assert manager.allocate_slots(child, 1) is None  # the copy needs a block: none free
    assert_frame_equal(manager.block_pool.snapshot(), before)
    assert manager.get_block_ids("c") == [1, 2] and child.num_computed_tokens == 6


def test_fork_errors() -> None:
    manager = make_manager(5)
    waiting = Request.from_block_keys("w", 4, [1])
    with pytest.raises(ValueError, match="request 'w' holds no blocks; only a running request can be forked"):
        manager.fork(waiting, "w2")
    admit(manager, waiting)
    with pytest.raises(ValueError, match="new_request_id 'w' already holds blocks"):
        manager.fork(waiting, "w")
    with pytest.raises(ValueError, match="request_id must be a non-empty string"):
        manager.fork(waiting, "")


# ---------------------------------------------------------------- elastic growth


def test_elastic_pool_grows_with_fresh_ids() -> None:
    manager = make_manager(3, max_blocks=6, events=True)  # null + 2 blocks, up to 6
    pool = manager.block_pool
    warm = Request.from_block_keys("warm", 4, [1])
    assert admit(manager, warm) == [1]
    manager.free(warm)
    manager.take_events()
    assert pool.get_num_available_blocks() == 5
    big = Request.from_block_keys("big", 16, [5, 6, 7, 8])
    assert admit(manager, big) == [2, 1, 3, 4]  # cached block 1 is still evicted before growing
    assert removed_keys(manager) == [1]
    assert (pool.num_blocks, pool.get_usage(), pool.get_num_available_blocks()) == (5, 1.0, 1)
    assert admit(manager, Request.from_block_keys("two", 5, [9])) is None
    with pytest.raises(ValueError, match=r"cannot get 2 free blocks from the pool: 0 free and room to grow by 1 "
                                         r"\(max_blocks=6\)"):
        pool.get_new_blocks(2)
    assert admit(manager, Request.from_block_keys("one", 4, [9])) == [5]
    assert pool.num_blocks == 6 and pool.get_num_available_blocks() == 0


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_blocks": 2**31}, r"max_blocks must be below 2\*\*31, got 2147483648"),
    ({"max_blocks": 0}, "max_blocks must be an integer >= 1, got 0"),
    ({"max_blocks": 3}, r"max_blocks must be None or >= num_blocks \(4\), got 3"),
])
def test_pool_rejects_bad_max_blocks(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        PagedBlockPool(**{"num_blocks": 4, **kwargs})


def test_fork_respects_request_ownership() -> None:
    """A second Request under a running id cannot fork it; a child's id is owned too."""
    manager = make_manager(8)
    first = Request.from_block_keys("a", 6, [0xA])
    assert admit(manager, first) == [1, 2]
    impostor = Request.from_block_keys("a", 6, [0xA])
    before = manager.block_pool.snapshot()
    with pytest.raises(ValueError, match="request id 'a' is already in use by another request"):
        manager.fork(impostor, "c")
    assert_frame_equal(manager.block_pool.snapshot(), before)
    child = manager.fork(first, "c")
    with pytest.raises(ValueError, match="request id 'c' is already in use by another request"):
        manager.free(Request.from_block_keys("c", 6, [0xA]))
    manager.free(child)
    manager.free(first)  # the id is free again
    assert admit(manager, impostor) == [2]


# ---------------------------------------------------------------- paged SSD store


def test_ssd_store_evicts_least_recently_used_first() -> None:
    """Saves insert (evicting the LRU block when full) or touch; loads touch; has_block does not."""
    ssd = PagedSSDCache(capacity_blocks=3)
    assert [ssd.save_block(k) for k in (0xA, 0xB, 0xC)] == [[], [], []]
    assert ssd.load_block(0xA) and ssd.has_block(0xB)  # has_block leaves 0xB least recent
    assert ssd.save_block(0xD) == [0xB]
    assert ssd.save_block(0xA) == []  # stored: only touched
    assert ssd.save_block(0xE) == [0xC]
    assert ssd.save_block(0xF) == [0xD]
    assert not ssd.load_block(0xB) and sorted(ssd.tier.resident()) == [0xA, 0xE, 0xF]
    counters = ssd.tier.counters
    assert (counters.written_blocks, counters.evicted_blocks, counters.read_blocks) == (6, 3, 1)
    with pytest.raises(ValueError, match="capacity_blocks must be an integer >= 1 or None, got 0"):
        PagedSSDCache(0)
    with pytest.raises(ValueError, match=r"block_hash must be a u64 block key .* got -1"):
        ssd.has_block(-1)


def test_ssd_only_hit_needs_the_data_on_the_ssd() -> None:
    """A 2-block SSD keeps the two most recently saved blocks: the pool still holds the
    first block's metadata, but its data is gone, so the lookup misses from block 0."""
    ssd = PagedSSDCache(capacity_blocks=2)
    manager = make_manager(8, ssd=ssd)
    first = Request.from_block_keys("a", 13, [0xA, 0xB, 0xC])
    assert admit(manager, first) == [1, 2, 3, 4]
    manager.free(first)
    assert sorted(ssd.tier.resident()) == [0xB, 0xC] and manager.block_pool.get_cached_block(0xA).block_id == 1
    again = Request.from_block_keys("b", 13, [0xA, 0xB, 0xC])
    assert manager.get_computed_blocks(again) == ([], 0)
    tail_only = Request.from_block_keys("c", 5, [0xA])
    assert manager.get_computed_blocks(tail_only) == ([], 0)
    assert [b.block_id for b in manager.get_cold_blocks()] == [2, 3]
    assert manager.get_ref_count_summary() == "rc0=3(ssd=2)"


def test_lookup_loads_hits_then_saves_new_blocks() -> None:
    """Hits are read from the SSD (most recent), then the request's new full blocks saved
    head first: the next eviction takes the oldest block no request touched since."""
    ssd = PagedSSDCache(capacity_blocks=3)
    manager = make_manager(8, ssd=ssd)
    a = Request.from_block_keys("a", 9, [0xA, 0xB])
    admit(manager, a)
    manager.free(a)
    b = Request.from_block_keys("b", 9, [0xA, 0xC])  # hits 0xA, saves 0xC
    assert admit(manager, b) == [3, 4]
    manager.free(b)
    assert ssd.tier.counters.read_blocks == 1 and sorted(ssd.tier.resident()) == [0xA, 0xB, 0xC]
    assert ssd.save_block(0xD) == [0xB]  # 0xB: saved first, never read


def test_lookup_never_evicts_a_block_it_matched() -> None:
    """Registering a key from the SSD takes the free queue's head block; when that head is
    a block the same lookup already matched, the walk ends there (and nothing changes)."""
    manager = make_manager(4, ssd=PagedSSDCache())  # null + 3 blocks
    a = Request.from_block_keys("a", 9, [0xA, 0xB])
    assert admit(manager, a) == [1, 2, 3]
    manager.free(a)
    x = Request.from_block_keys("x", 4, [0xE])
    assert admit(manager, x) == [3]
    manager.free(x)
    assert manager.evict_block_permanently(2)  # 0xB: out of the pool, still on the SSD
    y = Request.from_block_keys("y", 4, [0xF])
    assert admit(manager, y) == [2]
    manager.free(y)
    assert queue_ids(manager) == [1, 3, 2]  # block 1 (0xA) is the head
    before = manager.block_pool.snapshot()
    blocks, hit_tokens = manager.get_computed_blocks(Request.from_block_keys("b", 9, [0xA, 0xB]))
    assert (ids(blocks), hit_tokens, manager.stats.restored_blocks) == ([1], 4, 0)
    assert_frame_equal(manager.block_pool.snapshot(), before)


def test_restore_grows_an_elastic_pool() -> None:
    """With every block in use, a key on the SSD is registered in a new block."""
    manager = make_manager(3, max_blocks=4, ssd=PagedSSDCache())
    a = Request.from_block_keys("a", 4, [0xA])
    admit(manager, a)
    manager.free(a)
    manager.evict_block_permanently(1)
    busy = Request.from_block_keys("busy", 8, [0xB, 0xC])
    assert admit(manager, busy) == [2, 1]
    blocks, _ = manager.get_computed_blocks(Request.from_block_keys("b", 5, [0xA]))
    assert ids(blocks) == [3] and manager.block_pool.num_blocks == 4 and manager.stats.restored_blocks == 1


# ---------------------------------------------------------------- shared prefix, ref counts, cold blocks


def test_find_shared_prefix_and_ref_counts() -> None:
    manager = make_manager(8)
    a = Request.from_block_keys("a", 10, [0xA, 0xB])
    assert admit(manager, a) == [1, 2, 3]
    child = manager.fork(a, "c")
    assert manager.find_shared_prefix(Request.from_block_keys("q", 13, [0xA, 0xB, 0xC])) == ([1, 2], [0xA, 0xB], 5)
    assert manager.find_shared_prefix(Request.from_block_keys("r", 4, [0xA])) == ([], [], 4)  # last-token rule
    assert manager.get_ref_count_distribution() == {2: 3}
    manager.free(child)
    manager.free(a)
    assert manager.get_ref_count_distribution() == {0: 2}  # block 3 is free and uncached: not counted
    assert manager.get_ref_count_summary() == "rc0=2(ssd=0)"
    assert make_manager(4).get_ref_count_summary() == "rc=none"


def test_cold_block_api_follows_upstream_return_values() -> None:
    ssd = PagedSSDCache(capacity_blocks=1)
    manager = make_manager(6, ssd=ssd, events=True)
    a = Request.from_block_keys("a", 9, [0xA, 0xB])  # saving 0xB evicts 0xA from the 1-block SSD
    assert admit(manager, a) == [1, 2, 3]
    manager.take_events()
    for call in (manager.mark_block_cold, manager.evict_block_permanently):
        assert not call(1) and not call(0) and not call(99)  # in use, the null block, unknown
        with pytest.raises(ValueError, match="block_id must be an integer >= 0, got -1"):
            call(-1)
    manager.free(a)
    assert manager.mark_block_cold(1) and manager.stats.cold_marks == 1
    assert manager.block_pool.get_cached_block(0xA).block_id == 1  # cold: still in lookups
    assert not manager.restore_block(1) and manager.restore_block(2)  # 0xA's data is gone, 0xB's is there
    assert manager.restore_block(3) and not manager.restore_block(99)  # uncached: nothing to read
    assert manager.evict_block_permanently(1) and manager.stats.permanent_evictions == 1
    assert manager.block_pool.blocks[1].block_hash is None and removed_keys(manager) == [0xA]
    assert queue_ids(manager) == [3, 4, 5, 2, 1]  # kvlab keeps the block's place in the free queue
    assert [b.block_id for b in manager.get_cold_blocks()] == [2]


def test_manager_rejects_bad_arguments() -> None:
    from kvlab.engines.vllm.block_pool import BlockPool

    with pytest.raises(ValueError, match="pool must be a PagedBlockPool, got BlockPool"):
        PagedCacheManager(BlockPool(4, block_size=4), block_size=4)
    with pytest.raises(ValueError, match="ssd must be a PagedSSDCache or None, got int"):
        PagedCacheManager(PagedBlockPool(4, block_size=4), block_size=4, ssd=3)
    with pytest.raises(ValueError, match="ssd needs enable_caching=True"):
        PagedCacheManager(PagedBlockPool(4, block_size=4, enable_caching=False), block_size=4, enable_caching=False,
                          ssd=PagedSSDCache())


def test_copy_on_write_is_counted() -> None:
    manager = make_manager(6)
    parent = Request.from_block_keys("p", 6, [0xA])
    admit(manager, parent)
    child = manager.fork(parent, "c")
    child.append_block_keys(1)
    parent.append_block_keys(1)
    assert ids(manager.allocate_slots(child, 1)) == [3] and ids(manager.allocate_slots(parent, 1)) == []
    assert manager.stats.cow_copies == 1 and manager.get_block_ids("p") == [1, 2]
