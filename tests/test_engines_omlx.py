"""oMLX's paged cache (kvlab.engines.omlx): fork / copy-on-write, elastic growth, shared
prefixes, ref-count statistics, cold blocks and the paged-SSD-only mode — exact block ids,
ref counts and SSD eviction order — and its differential against the vLLM engine."""

from __future__ import annotations

import pytest
from polars.testing import assert_frame_equal

from kvlab.engines.omlx.paged_cache import PagedBlockPool, PagedCacheManager
from kvlab.engines.omlx.paged_ssd_cache import PagedSSDCache
from kvlab.engines.vllm.request import Request
from test_engines_vllm import HASHER4, admit, ids, queue_ids, removed_keys


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
