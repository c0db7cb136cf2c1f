"""Hypothesis state machine over oMLX's paged cache: the vLLM machine's rules and invariants
(test_engines_vllm_state.py) plus fork, an elastic pool, a paged SSD store of random
capacity, cold marks, permanent evictions and restores. Invariants after every step: ref
counts >= 0 and equal to the tables holding each block, blocks conserved (in use + free =
the pool), the pool within ``max_blocks``, the SSD store never over its capacity, the
ref-count distribution matching the blocks; lookups in paged-SSD-only mode hit only blocks
whose data the SSD holds."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule
from test_engines_vllm_state import BLOCK_SIZE, MAX_BLOCKS, NUM_BLOCKS, BlockPoolMachine

from kvlab.engines.omlx.paged_cache import PagedBlockPool, PagedCacheManager
from kvlab.engines.omlx.paged_ssd_cache import PagedSSDCache
from kvlab.engines.vllm.request import Request


class PagedCacheMachine(BlockPoolMachine):
    """The vLLM machine on :class:`PagedCacheManager`, with oMLX's operations."""

    @initialize(free_order=st.sampled_from(["classic", "current"]), caching=st.booleans(), elastic=st.booleans(),
                ssd_capacity=st.sampled_from([None, 0, 2, 5, 12]))
    def setup(self, free_order: str, caching: bool, elastic: bool = False, ssd_capacity: int | None = 0) -> None:
        """``ssd_capacity`` 0: no SSD store; ``None``: an unbounded one."""
        self.pool = PagedBlockPool(NUM_BLOCKS, block_size=BLOCK_SIZE, free_order=free_order, enable_caching=caching,
                                   enable_kv_cache_events=True, max_blocks=MAX_BLOCKS if elastic else None)
        self.ssd = PagedSSDCache(ssd_capacity) if caching and ssd_capacity != 0 else None
        self.manager = PagedCacheManager(self.pool, block_size=BLOCK_SIZE, enable_caching=caching, ssd=self.ssd)
        self._make_other()

    @precondition(lambda self: self._names(running=True))
    @rule(index=st.integers(0, 99))
    def fork(self, index: int) -> None:
        child = self.manager.fork(self._pick(index, running=True), self._new_id())
        self.requests[child.request_id] = child

    def _calls_on(self, request: Request) -> list:
        return [*super()._calls_on(request), lambda: self.manager.fork(request, self._new_id())]

    @rule(block_id=st.integers(0, MAX_BLOCKS + 1), op=st.sampled_from(["cold", "evict", "restore"]))
    def cold_block_api(self, block_id: int, op: str) -> None:
        """mark_block_cold / evict_block_permanently refuse blocks in use, the null block and
        unknown ids; a permanent eviction removes the block from lookups only."""
        block = self.pool.blocks[block_id] if block_id < self.pool.num_blocks else None
        refs = [b.ref_cnt for b in self.pool.blocks]
        on_ssd = None if self.ssd is None else set(self.ssd.tier.resident())
        if op == "restore":
            data_gone = block is not None and self.ssd is not None and block.block_hash is not None \
                and block.block_hash not in self.ssd
            assert self.manager.restore_block(block_id) is (block is not None and not data_gone)
        else:
            call = self.manager.mark_block_cold if op == "cold" else self.manager.evict_block_permanently
            allowed = block is not None and block.ref_cnt == 0 and not block.is_null
            assert call(block_id) is allowed
            if allowed and op == "evict":
                assert block.block_hash is None
        assert [b.ref_cnt for b in self.pool.blocks] == refs
        assert on_ssd is None or set(self.ssd.tier.resident()) == on_ssd

    @precondition(lambda self: self.ssd is not None and self._names(running=False))
    @rule(index=st.integers(0, 99))
    def evict_then_lookup(self, index: int) -> None:
        """Permanent eviction removes blocks from lookups, not their data: evicting a
        lookup's free hits, the next lookup registers them again from the SSD."""
        request = self._pick(index, running=False)
        first, _ = self.manager.get_computed_blocks(request)
        keys = [b.block_hash for b in first]
        evicted = [b.block_id for b in first if b.ref_cnt == 0]
        assert all(self.manager.evict_block_permanently(i) for i in evicted)
        restored = self.manager.stats.restored_blocks
        again, _ = self.manager.get_computed_blocks(request)
        assert [b.block_hash for b in again] == keys
        assert self.manager.stats.restored_blocks == restored + len(evicted)

    @invariant()
    def ssd_within_capacity(self) -> None:
        if self.ssd is not None:
            self.ssd.tier.check()
            assert self.ssd.capacity_blocks is None or len(self.ssd) <= self.ssd.capacity_blocks

    @invariant()
    def ref_count_statistics_match_blocks(self) -> None:
        dist = self.manager.get_ref_count_distribution()
        assert all(ref >= 0 and count > 0 for ref, count in dist.items())
        counted = [b for b in self.pool.blocks[1:] if b.ref_cnt or b.block_hash is not None]
        assert sum(dist.values()) == len(counted)
        assert dist.get(0, 0) == sum(1 for b in counted if b.ref_cnt == 0)

    @precondition(lambda self: self._names(running=False))
    @rule(index=st.integers(0, 99))
    def lookup(self, index: int) -> None:
        """A lookup's hits are distinct blocks holding the request's keys in order; in
        paged-SSD-only mode only blocks whose data the SSD holds, and a lookup registering
        blocks from the SSD changes no ref count."""
        request = self._pick(index, running=False)
        refs = [b.ref_cnt for b in self.pool.blocks]
        blocks, num_hit_tokens = self.manager.get_computed_blocks(request)
        assert [b.block_hash for b in blocks] == request.block_hashes[:len(blocks)]
        assert len({b.block_id for b in blocks}) == len(blocks) and num_hit_tokens == len(blocks) * BLOCK_SIZE
        assert self.ssd is None or all(b.block_hash in self.ssd for b in blocks)
        assert [b.ref_cnt for b in self.pool.blocks[:len(refs)]] == refs

TestPagedCacheMachine = PagedCacheMachine.TestCase
TestPagedCacheMachine.settings = settings(settings(), stateful_step_count=80)


@pytest.mark.parametrize(("free_order", "resumed_table"), [("classic", [1, 2, 8]), ("current", [1, 2, 3])])
def test_machine_rules_on_a_fixed_run(free_order: str, resumed_table: list[int]) -> None:
    """One scripted run through the rules with exact tables: fork + copy-on-write, a
    shared-prefix admission, preemption and resume (the freed partial block 3 is reused at
    once only in current order), then a reset once everything is free."""
    machine = PagedCacheMachine()
    machine.setup(free_order=free_order, caching=True)
    machine.add_request([0, 1], 2)  # r1: 10 tokens, keys 1000, 1001
    machine.admit(0, 12)
    machine.fork(0)  # r2 shares blocks 1, 2, 3
    machine.step(1, 12)  # r2 decodes into shared partial block 3: its copy is block 4
    machine.add_request([0, 1, 2, 0, 1], 0)  # r3: 20 tokens, hits r1's two blocks
    machine.admit(0, 12)
    machine.preempt(0)  # r1
    machine.admit(0, 12)  # r1 resumes on its own cached blocks
    tables = {rid: machine.manager.get_block_ids(rid) for rid in machine.requests}
    assert tables == {"r1": resumed_table, "r2": [1, 2, 4], "r3": [1, 2, 5, 6, 7]}
    assert [machine.pool.blocks[i].ref_cnt for i in (1, 2)] == [3, 3]
    for check in (machine.pool_is_consistent, machine.hash_map_matches_blocks, machine.ref_counts_count_tables):
        check()
    stats = machine.manager.make_prefix_cache_stats()
    assert (stats.requests, stats.hits, stats.preempted_requests, stats.preempted_hits) == (2, 8, 1, 8)
    machine.reset(0)  # refused: blocks in use
    for _ in range(3):
        machine.finish(0)
    machine.reset(0)
    assert machine.pool.cached_block_hash_to_block == {} and machine.pool.get_usage() == 0.0
