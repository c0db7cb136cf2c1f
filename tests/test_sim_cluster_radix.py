"""The SGLang worker cache (kvlab.sim.cluster.radix_manager) alone, then inside ``simulate``.

Expected values follow SGLang 0.5.23's rules (docs/specs/engines.md S2–S7) and the cluster
rules of /work/shared/specs/cluster_sim.md (C4 conservation, C5/C19 preemption).
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.engines.sglang import RadixCache
from kvlab.engines.vllm.block_pool import BlockPool
from kvlab.engines.vllm.kv_cache_manager import KVCacheManager
from kvlab.engines.vllm.request import Request
from kvlab.events.types import BlockRemoved, BlockStored
from kvlab.sim.cluster import ClusterConfig, simulate
from kvlab.sim.cluster.radix_manager import RadixManager
from kvlab.sim.cluster.worker import Worker
from kvlab.traces import Trace, load_trace

BS = 4


def _run(m: RadixManager, rid: str, num_tokens: int, keys: list[int]) -> Request:
    """Admit a request with its hit, compute its whole prompt, free it (one-token output)."""
    er = Request.from_block_keys(rid, num_tokens, keys)
    hit, hit_tokens = m.get_computed_blocks(er)
    assert m.allocate_slots(er, num_tokens - hit_tokens, hit_tokens, hit) is not None
    m.free(er)
    return er


# ---------------------------------------------------------------------------- admission hit rule
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(1, 3), min_size=0, max_size=5), st.integers(0, BS - 1)),
                min_size=1, max_size=8))
def test_block_radix_equals_sglang_over_tokens(prompts: list[tuple[list[int], int]]) -> None:
    """The mapping claim: SGLang with ``page_size = block_size`` over the real tokens and the
    manager's page-1 tree over block keys give the same hits (``match_prefix(tokens[:-1])`` page
    aligned = ``(P − 1) // bs`` blocks) and the same tree — node for node, same lengths in pages,
    same logical times (no eviction: room for everything)."""
    m = RadixManager(1000, block_size=BS)
    tokens_cache = RadixCache(page_size=BS, kv_pool_size=1000 * BS)
    chain: dict[tuple[int, ...], int] = {}
    for i, (contents, extra) in enumerate(prompts):
        num_tokens = len(contents) * BS + extra
        if num_tokens == 0:
            continue
        keys = [chain.setdefault(tuple(contents[:j + 1]), 100 + len(chain)) for j in range(len(contents))]
        tokens = [c for c in contents for _ in range(BS)] + [9] * extra
        er = _run(m, f"r{i}", num_tokens, keys)
        hit = tokens_cache.match_prefix(tokens[:-1])
        assert er.num_computed_tokens == num_tokens
        tokens_cache.inc_lock_ref(hit.last_node)
        own = tokens_cache.allocator.alloc(num_tokens - hit.prefix_len)
        tokens_cache.cache_finished_req(tokens + [0], np.concatenate([hit.indices, own]), hit.last_node)
        assert m.cache.clock == tokens_cache.clock
    blocks = m.cache.snapshot().select("depth", "num_tokens", "last_access_time", "lock_ref")
    pages = tokens_cache.snapshot().select("depth", pl.col("num_tokens") // BS, "last_access_time", "lock_ref")
    assert blocks.equals(pages)


def test_hit_rule_keeps_the_last_token() -> None:
    """S3: the last prompt token is always computed: 12 tokens over 3 cached blocks hit 2, 13 hit 3."""
    m = RadixManager(16, block_size=BS)
    _run(m, "a", 13, [1, 2, 3])
    assert m.get_computed_blocks(Request.from_block_keys("b", 12, [1, 2, 3]))[1] == 8
    assert m.get_computed_blocks(Request.from_block_keys("c", 13, [1, 2, 3]))[1] == 12
    assert m.get_computed_blocks(Request.from_block_keys("d", 4, [1]))[1] == 0


# ---------------------------------------------------------------------------- eviction
def test_eviction_takes_unlocked_leaves_only() -> None:
    """S6/S7 with 5 slots: tree ``[1]─{[2], [3]}``; a running request locks ``[1] [2]``; a new
    request short of slots evicts the unlocked leaf ``[3]`` and nothing else; the next one, which
    would need locked blocks, is refused and changes nothing."""
    m = RadixManager(5, block_size=BS)
    _run(m, "a", 9, [1, 2])           # tree [1 2]; 3 slots taken, the tail given back
    b = _run(m, "b", 9, [1, 3])       # hits [1]: the node splits, [3] is a new leaf
    assert b.num_computed_tokens == 9
    assert (m.allocator.available_size(), m.num_cached_blocks()) == (2, 3)
    c = Request.from_block_keys("c", 9, [1, 2])
    hit, hit_tokens = m.get_computed_blocks(c)
    assert hit_tokens == 8
    assert m.allocate_slots(c, 1, hit_tokens, hit) is not None      # one tail slot
    assert (m.allocator.available_size(), m.cache.evictable_size(), m.cache.protected_size()) == (1, 1, 2)
    d = Request.from_block_keys("d", 8, [7, 8])
    assert len(m.allocate_slots(d, 8, 0, m.get_computed_blocks(d)[0])) == 2   # evicts [3] (1 slot)
    assert [m.cached_prefix_blocks(k) for k in ([1, 2], [1, 3], [7, 8])] == [2, 1, 0]
    assert m.num_free_blocks() == 0
    before = (m.cache.pretty(), m.allocator.free_slots().tolist())
    e = Request.from_block_keys("e", 5, [9])
    assert m.allocate_slots(e, 5, 0, m.get_computed_blocks(e)[0]) is None
    assert e.num_computed_tokens == 0 and "e" not in m._held
    assert (m.cache.pretty(), m.allocator.free_slots().tolist()) == before


def test_eviction_frees_the_request_size_not_the_shortfall() -> None:
    """SGLang's ``evict_from_tree_cache`` evicts ``need`` tokens when the free slots fall short,
    whole leaves: 1 free slot, 2 needed → both unlocked one-block leaves go (vLLM would take one)."""
    m = RadixManager(4, block_size=BS)
    _run(m, "a", 4, [1])
    _run(m, "b", 4, [2])
    _run(m, "c", 4, [3])
    assert (m.allocator.available_size(), m.num_cached_blocks()) == (1, 3)
    d = Request.from_block_keys("d", 8, [7, 8])
    m.allocate_slots(d, 8, 0, m.get_computed_blocks(d)[0])
    assert [m.cached_prefix_blocks([k]) for k in (1, 2, 3)] == [0, 0, 1]   # LRU: [1] then [2]
    assert m.allocator.available_size() == 1


def test_cached_prefix_blocks_is_pure() -> None:
    """Unlike ``match_prefix`` (S2), the truth walk neither splits nor stamps."""
    m = RadixManager(8, block_size=BS)
    _run(m, "a", 13, [1, 2, 3])
    before = m.cache.snapshot()
    assert m.cached_prefix_blocks([1, 2, 9]) == 2 and m.cached_prefix_blocks([5]) == 0
    assert m.cache.snapshot().equals(before)


# ---------------------------------------------------------------------------- slots per request
def test_decode_fast_path_and_block_boundaries() -> None:
    """Slots follow ``num_computed_tokens`` whatever advanced it: the worker's decode fast path
    moves it without a call; a call at a block boundary takes exactly the missing slot."""
    m = RadixManager(8, block_size=BS)
    er = Request.from_block_keys("r", 5, [1])
    assert len(m.allocate_slots(er, 5)) == 2
    for _ in range(2):                              # tokens 6, 7: no block filled or started
        er.append_block_keys(1)
        er.num_computed_tokens += 1
    er.append_block_keys(1, [50])                   # token 8 fills block 1
    assert m.allocate_slots(er, 1) == []
    er.append_block_keys(1)                          # token 9 starts block 2
    assert len(m.allocate_slots(er, 1)) == 1
    assert m.allocator.available_size() == 5
    m.free(er)
    assert (m.num_cached_blocks(), m.cached_prefix_blocks([1, 50]), m.allocator.available_size()) == (2, 2, 6)


def test_prefill_is_matchable_from_the_next_step_and_deduplicated() -> None:
    """S5 ``cache_unfinished_req`` at the next schedule: two requests with one prompt scheduled in
    one step both miss (vLLM: the second hits, it caches at allocation); at the next step the
    first's blocks are inserted and the second's duplicates freed (SGLang de-duplicates, vLLM
    does not, V8)."""
    m = RadixManager(8, block_size=BS)
    a, b = Request.from_block_keys("a", 9, [1, 2]), Request.from_block_keys("b", 9, [1, 2])
    for er in (a, b):
        hit, hit_tokens = m.get_computed_blocks(er)
        assert hit_tokens == 0
        m.allocate_slots(er, 9, hit_tokens, hit)
    assert m.allocator.available_size() == 2
    m.begin_schedule()
    assert (m.allocator.available_size(), m.num_cached_blocks(), m.cache.protected_size()) == (4, 2, 2)
    assert m.get_computed_blocks(Request.from_block_keys("c", 9, [1, 2]))[1] == 8
    pool = BlockPool(9, block_size=BS)
    vllm = KVCacheManager(pool, block_size=BS)
    va, vb = Request.from_block_keys("a", 9, [1, 2]), Request.from_block_keys("b", 9, [1, 2])
    vllm.allocate_slots(va, 9)
    assert vllm.get_computed_blocks(vb)[1] == 8


def test_preempt_is_sglang_retract() -> None:
    """``retract_decode``: the prompt inserted after its prefill stays cached; the block decoded
    since is freed without insertion, so the re-admitted request hits 2 blocks, not 3 (vLLM: 3,
    C19)."""
    m = RadixManager(8, block_size=BS)
    er = Request.from_block_keys("r", 9, [1, 2])
    m.allocate_slots(er, 9)
    m.begin_schedule()                               # prompt [1 2] inserted, locked
    er.append_block_keys(3, [50])                    # decode to 12 tokens: block 50 full
    er.num_computed_tokens = 11
    m.allocate_slots(er, 1)
    er.append_block_keys(1)
    m.allocate_slots(er, 1)                          # token 13 starts block 3
    m.preempt(er)
    assert (er.num_computed_tokens, er.num_preemptions) == (0, 1)
    assert (m.allocator.available_size(), m.num_free_blocks(), m.num_cached_blocks()) == (6, 8, 2)
    assert m.get_computed_blocks(er)[1] == 8


def test_caller_mistakes() -> None:
    m = RadixManager(8, block_size=BS)
    er = Request.from_block_keys("r", 9, [1, 2])
    with pytest.raises(ValueError, match="num_new_computed_tokens=4"):
        m.allocate_slots(er, 5, 4)
    with pytest.raises(ValueError, match="goes past the end"):
        m.allocate_slots(er, 10)
    assert m.allocator.available_size() == 8 and m.cache.protected_size() == 0
    m.allocate_slots(er, 4)
    with pytest.raises(ValueError, match="another live Request"):
        m.allocate_slots(Request.from_block_keys("r", 9, [1, 2]), 1)
    with pytest.raises(ValueError, match="holds no slots"):
        m.preempt(Request.from_block_keys("x", 9, [1, 2]))


def test_events_name_block_keys() -> None:
    """S9 events, page ids renamed to block keys: a store per new leaf chained to its parent's
    last block, a removal per evicted leaf."""
    m = RadixManager(3, block_size=BS, enable_kv_cache_events=True)
    _run(m, "a", 8, [1, 2])
    _run(m, "b", 8, [1, 3])
    c = Request.from_block_keys("c", 8, [7, 8])
    m.allocate_slots(c, 8, 0, m.get_computed_blocks(c)[0])
    events = m.take_events()
    assert [(type(e).__name__, e.block_keys_u64()) for e in events] == [
        ("BlockStored", (1, 2)), ("BlockStored", (3,)), ("BlockRemoved", (2, 3))]
    assert events[1].parent_block_hash == 1 and events[1].block_size == BS
    assert all(isinstance(e, (BlockStored, BlockRemoved)) for e in events)


# ---------------------------------------------------------------------------- the worker
def test_worker_reads_the_radix_cache() -> None:
    w = Worker(0, "mixed", ClusterConfig(capacity_blocks=64, engine="sglang"))
    assert isinstance(w.manager, RadixManager)
    assert (w.free_blocks, w.cached_blocks, w.cached_prefix_blocks([5])) == (64, 0, 0)
    with pytest.raises(ValueError, match="engine"):
        ClusterConfig(engine="trtllm")
    assert ClusterConfig(engine="sglang").to_dict()["engine"] == "sglang"


# ---------------------------------------------------------------------------- simulate
def _trace(rows: list[tuple[float, int, list[int]]]) -> Trace:
    """Requests ``(arrival_s, input_tokens, trace keys)``, one output token, 16-token blocks."""
    return Trace(pl.DataFrame({"request_id": list(range(len(rows))), "arrival_s": [r[0] for r in rows],
                               "input_tokens": [r[1] for r in rows], "output_tokens": [1] * len(rows),
                               "block_keys": [r[2] for r in rows]}), block_size=16, source="radix-test")


def _spaced_conversation(num: int) -> Trace:
    """The conversation trace's first requests, 100 s apart: each is served alone."""
    frame = load_trace("conversation").head(num).frame.with_columns(
        arrival_s=pl.int_range(pl.len()).cast(pl.Float64) * 100.0)
    return Trace(frame, block_size=512, source="conversation-spaced")


def test_simulate_sglang_completes_and_conserves() -> None:
    """C4 (checked by the loop at the end): every request done or rejected, every slot back,
    with preemptions (C5) on the way; rejected are exactly the requests that cannot fit."""
    trace = load_trace("conversation").head(40)
    result = simulate(trace, engine="sglang", num_workers=2, capacity_blocks=1500)
    requests = result.requests
    too_big = ((requests["input_tokens"] + requests["output_tokens"] + 15) // 16 > 1500).to_list()
    assert requests["rejected"].to_list() == too_big and any(too_big)
    assert requests.filter(~pl.col("rejected"))["finish_s"].is_not_null().all()
    assert requests["preemptions"].sum() > 0
    assert result.summary.to_dict()["config"]["engine"] == "sglang"


def test_simulate_hits_equal_vllm_without_eviction() -> None:
    """Room for everything and one request at a time: both caches hold every prompt, both hit
    ``(P − 1) // bs`` blocks of the longest cached prefix, request by request."""
    trace = _spaced_conversation(30)
    hits = {engine: simulate(trace, engine=engine, num_workers=2, capacity_blocks=100_000)
            .requests["hit_blocks"].to_list() for engine in ("vllm", "sglang")}
    assert hits["vllm"] == hits["sglang"] and sum(hits["vllm"]) > 0


def test_simulate_same_step_sharers() -> None:
    """Two 33-token copies of one prompt arriving together are scheduled in one step: vLLM caches
    blocks when allocated, so the second hits (33 − 1) // 16 = 2 blocks; SGLang inserts a prompt
    after its prefill step (``cache_unfinished_req``), so both miss; a third copy a step later hits
    2 blocks in both."""
    trace = _trace([(0.0, 33, [1, 2, 3]), (0.0, 33, [1, 2, 3]), (50.0, 33, [1, 2, 3])])
    vllm = simulate(trace, engine="vllm", capacity_blocks=100)
    sglang = simulate(trace, engine="sglang", capacity_blocks=100)
    assert vllm.requests["hit_blocks"].to_list() == [0, 2, 2]
    assert sglang.requests["hit_blocks"].to_list() == [0, 0, 2]


def test_simulate_leaf_versus_block_eviction() -> None:
    """4 blocks of 16 tokens, one request at a time: R0 (49 tokens, blocks A1 A2 A3 + a tail),
    R1 (17 tokens: B1 + a tail, needs 2 blocks with 1 free), R2 = R0's prompt again.

    vLLM evicts LRU *blocks*: R0 freed its table in reverse (tail, A3, A2, A1), so R1 takes the
    free tail block and evicts A3 only; R2 then hits A1 A2 (2 blocks). SGLang evicts whole
    unlocked *leaves*: R0's prompt is one node [A1 A2 A3], and ``evict(2)`` must take all of it
    (S7: whole nodes; and it evicts the request size, not the 1-block shortfall); R2 misses."""
    trace = _trace([(0.0, 49, [1, 2, 3, 4]), (100.0, 17, [5, 6]), (200.0, 49, [1, 2, 3, 4])])
    vllm = simulate(trace, engine="vllm", capacity_blocks=4)
    sglang = simulate(trace, engine="sglang", capacity_blocks=4)
    assert vllm.requests["hit_blocks"].to_list() == [0, 0, 2]
    assert sglang.requests["hit_blocks"].to_list() == [0, 0, 0]


def test_simulate_index_router_with_sglang_events() -> None:
    """The renamed KV events feed the index: with events delivered at once it credits exactly
    what the chosen worker holds."""
    trace = load_trace("conversation").head(25)
    requests = simulate(trace, engine="sglang", num_workers=2, capacity_blocks=100_000, router="scorer").requests
    assert requests["index_prefix_blocks"].to_list() == requests["true_prefix_blocks"].to_list()
    assert requests["true_prefix_blocks"].sum() > 0
