"""Hypothesis state machine over the vLLM v1 block pool + KV cache manager: random
admissions (lookup + allocate), chunked prefill, decode, free, preempt, evict and reset,
plus misuse that must be rejected without a change (hits that are not the request's cached
blocks, another pool's blocks, a second Request object under a running id), with the
pool's invariants checked after every step. test_engines_omlx_state.py extends the machine
with oMLX's fork, elastic pool and paged SSD store."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from polars.testing import assert_frame_equal

from kvlab.engines.vllm.block_pool import BlockPool
from kvlab.engines.vllm.kv_cache_manager import KVCacheManager
from kvlab.engines.vllm.kv_cache_utils import KVCacheBlock
from kvlab.engines.vllm.request import Request

BLOCK_SIZE = 4
NUM_BLOCKS = 9  # null block + 8
MAX_BLOCKS = 12  # the most blocks a machine's pool may hold (oMLX's elastic runs grow to it)


class BlockPoolMachine(RuleBasedStateMachine):
    """Requests draw chained keys from a small tree (3 children per node, depth <= 5), so
    prompts share prefixes often and the 8 usable blocks are under constant pressure."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: dict[str, Request] = {}
        self.keys: dict[tuple[int, ...], int] = {}  # prefix path -> chained key
        self.next_id = 0

    @initialize(free_order=st.sampled_from(["classic", "current"]), caching=st.booleans())
    def setup(self, free_order: str, caching: bool) -> None:
        self.pool = BlockPool(NUM_BLOCKS, block_size=BLOCK_SIZE, free_order=free_order, enable_caching=caching,
                              enable_kv_cache_events=True)
        self.manager = KVCacheManager(self.pool, block_size=BLOCK_SIZE, enable_caching=caching)
        self._make_other()

    def _make_other(self) -> None:
        self.other = BlockPool(NUM_BLOCKS, block_size=BLOCK_SIZE)  # its blocks must never be accepted
        self.other.get_new_blocks(2)

    def _key(self, path: tuple[int, ...]) -> int:
        return self.keys.setdefault(path, 1000 + len(self.keys))

    def _names(self, running: bool) -> list[str]:
        return sorted(rid for rid in self.requests if bool(self.manager.get_block_ids(rid)) == running)

    def _pick(self, index: int, running: bool) -> Request:
        names = self._names(running)
        return self.requests[names[index % len(names)]]

    def _new_id(self) -> str:
        self.next_id += 1
        return f"r{self.next_id}"

    @rule(path=st.lists(st.integers(0, 2), max_size=5), tail=st.integers(0, BLOCK_SIZE - 1))
    def add_request(self, path: list[int], tail: int) -> None:
        num_tokens = len(path) * BLOCK_SIZE + tail
        if num_tokens:
            keys = [self._key(tuple(path[: i + 1])) for i in range(len(path))]
            rid = self._new_id()
            self.requests[rid] = Request.from_block_keys(rid, num_tokens, keys)

    @precondition(lambda self: self._names(running=False))
    @rule(index=st.integers(0, 99), budget=st.integers(1, 12))
    def admit(self, index: int, budget: int) -> None:
        """Lookup + allocate (touches hits); a rejection must leave everything as it was."""
        request = self._pick(index, running=False)
        hits, num_hit_tokens = self.manager.get_computed_blocks(request)
        assert num_hit_tokens <= request.num_tokens - 1
        before, stats_before = self.pool.snapshot(), vars(self.manager.prefix_cache_stats).copy()
        num_new = min(budget, request.num_tokens - num_hit_tokens)
        if self.manager.allocate_slots(request, num_new, num_hit_tokens, hits) is None:
            assert_frame_equal(self.pool.snapshot(), before)
            assert vars(self.manager.prefix_cache_stats) == stats_before
            assert request.num_computed_tokens == 0
        else:
            assert request.num_computed_tokens == num_hit_tokens + num_new

    @precondition(lambda self: self._names(running=True))
    @rule(index=st.integers(0, 99), budget=st.integers(1, 12))
    def step(self, index: int, budget: int) -> None:
        """Continue a chunked prefill, or decode one token (which may fill a block)."""
        request = self._pick(index, running=True)
        if request.num_computed_tokens == request.num_tokens:
            full = (request.num_tokens + 1) // BLOCK_SIZE > len(request.block_hashes)
            request.append_block_keys(1, [self._key(("decode", self._new_id()))] if full else [])
        todo = request.num_tokens - request.num_computed_tokens
        self.manager.allocate_slots(request, min(budget, todo))

    @precondition(lambda self: self._names(running=True))
    @rule(index=st.integers(0, 99))
    def finish(self, index: int) -> None:
        request = self._pick(index, running=True)
        self.manager.free(request)
        del self.requests[request.request_id]

    @precondition(lambda self: self._names(running=True))
    @rule(index=st.integers(0, 99))
    def preempt(self, index: int) -> None:
        request = self._pick(index, running=True)
        self.manager.preempt(request)
        assert request.num_computed_tokens == 0

    def _rejected(self, call, message: str) -> None:
        """``call`` must raise ValueError matching ``message`` and change nothing."""
        before, other = self.pool.snapshot(), self.other.snapshot()
        tables = {rid: self.manager.get_block_ids(rid) for rid in self.requests}
        computed = {rid: r.num_computed_tokens for rid, r in self.requests.items()}
        with pytest.raises(ValueError, match=message):
            call()
        assert_frame_equal(self.pool.snapshot(), before)
        assert_frame_equal(self.other.snapshot(), other)
        assert tables == {rid: self.manager.get_block_ids(rid) for rid in self.requests}
        assert computed == {rid: r.num_computed_tokens for rid, r in self.requests.items()}

    @precondition(lambda self: self.manager.enable_caching and self._names(running=False))
    @rule(index=st.integers(0, 99), picks=st.lists(st.integers(0, MAX_BLOCKS - 1), min_size=1, max_size=4))
    def admit_with_arbitrary_hits(self, index: int, picks: list[int]) -> None:
        """Hits picked at random: accepted only when each is a distinct non-null block of
        the pool holding the request's key at its position."""
        request = self._pick(index, running=False)
        hits = [self.pool.blocks[i % self.pool.num_blocks] for i in picks]
        num_hit_tokens = len(hits) * BLOCK_SIZE
        if num_hit_tokens >= request.num_tokens:
            return
        valid = (len({b.block_id for b in hits}) == len(hits) and not any(b.is_null for b in hits)
                 and all(b.block_hash == k for b, k in zip(hits, request.block_hashes, strict=False)))
        if not valid:
            self._rejected(lambda: self.manager.allocate_slots(request, 1, num_hit_tokens, hits),
                           r"new_computed_blocks\[\d\] \(block \d+\)")
        elif self.manager.allocate_slots(request, 1, num_hit_tokens, hits) is not None:
            assert request.num_computed_tokens == num_hit_tokens + 1

    @rule(index=st.integers(0, 99), which=st.sampled_from(["other", "hand-made", "int"]),
          op=st.sampled_from(["touch", "free", "cache"]))
    def foreign_blocks(self, index: int, which: str, op: str) -> None:
        block = {"other": self.other.blocks[1 + index % (NUM_BLOCKS - 1)],
                 "hand-made": KVCacheBlock(index % NUM_BLOCKS), "int": index}[which]
        calls = {"touch": lambda: self.pool.touch([block]), "free": lambda: self.pool.free_blocks([block]),
                 "cache": lambda: self.pool.cache_full_blocks([block], [5], 0, 1)}
        if op == "cache" and not self.manager.enable_caching:
            return
        self._rejected(calls[op], r"blocks\[0\] (\(block \d+\) is not a block of this|must be a KVCacheBlock)")

    @precondition(lambda self: self._names(running=True))
    @rule(index=st.integers(0, 99))
    def impostor(self, index: int) -> None:
        """A second Request object with a running request's id is refused everywhere."""
        request = self._pick(index, running=True)
        twin = replace(request, num_computed_tokens=0, block_hashes=list(request.block_hashes))
        message = f"request id {request.request_id!r} is already in use by another request"
        for call in self._calls_on(twin):
            self._rejected(call, message)

    def _calls_on(self, request: Request) -> list:
        """The manager calls that take a running request (each must refuse an impostor)."""
        return [lambda: self.manager.allocate_slots(request, 1), lambda: self.manager.free(request),
                lambda: self.manager.preempt(request)]

    @rule(block_ids=st.lists(st.integers(0, NUM_BLOCKS - 1), max_size=3))
    def evict(self, block_ids: list[int]) -> None:
        refs = [b.ref_cnt for b in self.pool.blocks]
        self.pool.evict_blocks(block_ids)
        assert [b.ref_cnt for b in self.pool.blocks] == refs

    @precondition(lambda self: self.requests)
    @rule(now=st.integers(0, 3))
    def reset(self, now: int) -> None:
        """Reset (a quarter of the time, so caches also grow old): refused while in use."""
        if now:
            return
        idle = all(not self.manager.get_block_ids(rid) for rid in self.requests)
        assert self.manager.reset_prefix_cache() is idle
        if idle:
            assert self.pool.cached_block_hash_to_block == {}

    @invariant()
    def pool_is_consistent(self) -> None:
        pool = self.pool
        blocks = pool.blocks[1:]
        assert pool.null_block is pool.blocks[0] and not pool.null_block.in_free_queue
        assert all(b.ref_cnt >= 0 for b in pool.blocks)
        queued = pool.free_block_queue.get_all_free_blocks()
        assert len(queued) == pool.get_num_free_blocks() == len({b.block_id for b in queued})
        assert {b.block_id for b in queued} == {b.block_id for b in blocks if b.ref_cnt == 0}
        assert all(b.in_free_queue == (b.ref_cnt == 0) for b in blocks)
        in_use = sum(1 for b in blocks if b.ref_cnt > 0)
        assert in_use + pool.get_num_free_blocks() == pool.num_blocks - 1
        assert NUM_BLOCKS <= pool.num_blocks <= getattr(pool, "max_blocks", NUM_BLOCKS) <= MAX_BLOCKS
        assert [b.block_id for b in pool.blocks] == list(range(pool.num_blocks))
        assert 0.0 <= pool.get_usage() <= 1.0

    @invariant()
    def hash_map_matches_blocks(self) -> None:
        mapped = set()
        for key, copies in self.pool.cached_block_hash_to_block.items():
            assert copies, f"empty entry for {key}"
            for block_id, block in copies.items():
                assert block is self.pool.blocks[block_id] and block.block_hash == key
                mapped.add(block_id)
        assert mapped == {b.block_id for b in self.pool.blocks if b.block_hash is not None}

    @invariant()
    def ref_counts_count_tables(self) -> None:
        """A block in several tables has a ref per table; the tables cover the computed tokens."""
        holders = Counter(i for rid in self.requests for i in self.manager.get_block_ids(rid))
        assert all(self.pool.blocks[i].ref_cnt == holders[i] for i in range(1, self.pool.num_blocks))
        for request in self.requests.values():
            table = self.manager.get_block_ids(request.request_id)
            assert len(table) == -(-request.num_computed_tokens // BLOCK_SIZE)


TestBlockPoolMachine = BlockPoolMachine.TestCase
TestBlockPoolMachine.settings = settings(settings(), stateful_step_count=80)
