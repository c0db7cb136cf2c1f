"""EventIngestor: llm-d's event pool (docs/specs/index_blend.md §A.6, rules L17-L19) on every backend.

Scenarios T-P1..T-P8 exactly (canonical block 64 unless stated); the sequence rules (gap,
duplicate, late, restart, DP ranks); a bad event inside a batch; and consistency with the
caches: a vLLM BlockPool and an SGLang RadixCache driven at random (hypothesis) feed the
index, which after every step must hold exactly the request keys of their cached blocks.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.engines.sglang.radix_cache import RadixCache
from kvlab.engines.sglang.tree_node import RadixKey, iter_tree
from kvlab.engines.vllm.block_pool import BlockPool
from kvlab.engines.vllm.kv_cache_manager import KVCacheManager
from kvlab.engines.vllm.request import Request
from kvlab.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, decode_frames, encode_frames
from kvlab.hashing import RequestExtras, sim
from kvlab.hashing.llmd_hash import LlmdHasher
from kvlab.index import EventError, EventIngestor, SeqGap, parse_topic
from kvlab.index.memory import InMemoryIndex
from kvlab.index.radix import RadixIndex
from kvlab.index.types import PodEntry

TOKENS_128 = list(range(1000, 1128))


class IndexFactory:
    """Makes empty indexes of one backend; ``backend`` names it."""

    def __init__(self, factory, backend: str) -> None:
        self.factory, self.backend = factory, backend

    def __call__(self):
        return self.factory()


@pytest.fixture(params=["memory", "redis", "radix"])
def make_index(request: pytest.FixtureRequest) -> IndexFactory:
    if request.param == "redis":
        return IndexFactory(request.getfixturevalue("redis_index_factory"), "redis")
    return IndexFactory({"memory": InMemoryIndex, "radix": RadixIndex}[request.param], request.param)


def stored(hashes, tokens, block_size, *, parent=None, medium="GPU", lora_name=None, group_idx=None,
           extra_keys=None) -> BlockStored:
    return BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=tokens, block_size=block_size,
                       lora_id=None, medium=medium, lora_name=lora_name, extra_keys=extra_keys, group_idx=group_idx)


def canonical(tokens, block_size: int = 64, **kwargs) -> list[int]:
    """llm-d's request keys of ``tokens`` (kvlab.hashing.llmd, pinned by golden vectors)."""
    return LlmdHasher(block_size=block_size, **kwargs).block_hashes(tokens)


def feed(ingestor: EventIngestor, pod: str, *events, seq: int | None = None, ts: float = 0.0) -> str:
    """One batch of ``events`` from ``pod``, at the pod's next seq unless given."""
    if seq is None:
        seq = ingestor.stats.last_seq.get((pod, None), -1) + 1
    return ingestor.ingest_batch(pod, seq, EventBatch(ts, list(events)))


def pods_at(index, key: int) -> set[PodEntry]:
    return set(index.lookup([key]).get(key, ()))


# ---- T-P1 .. T-P8 -----------------------------------------------------------------------
def test_tp1_small_engine_blocks_map_many_to_one(make_index) -> None:
    index = make_index()
    ingestor = EventIngestor(index, block_size=64)
    engine = list(range(101, 109))
    feed(ingestor, "pod-a", stored(engine, TOKENS_128, 16))
    c = canonical(TOKENS_128)
    assert len(c) == 2 and all(pods_at(index, k) == {PodEntry("pod-a")} for k in c)
    assert [index.get_request_key(e) for e in engine] == [c[i // 4] for i in range(8)]
    assert ingestor.stats.applied == {"BlockStored": 1} and not ingestor.stats.skipped


def test_tp2_large_engine_blocks_map_one_to_many(make_index) -> None:
    index = make_index()
    ingestor = EventIngestor(index, block_size=64)
    tokens = list(range(256))
    feed(ingestor, "pod-a", stored([500, 501], tokens, 128))
    c = canonical(tokens)
    assert len(c) == 4 and [index.get_request_key(500), index.get_request_key(501)] == [c[1], c[3]]
    feed(ingestor, "pod-a", BlockRemoved([500], "GPU"))
    assert pods_at(index, c[0]) == pods_at(index, c[1]) == set()
    if make_index.backend == "radix":  # Dynamo's cascade (D4): c2, c3 hang under the emptied c1
        assert index.pod_keys("pod-a") == set() and index.get_request_key(501) is None
    else:
        assert pods_at(index, c[2]) == pods_at(index, c[3]) == {PodEntry("pod-a")}


def test_tp3_engines_with_different_block_sizes_converge(make_index) -> None:
    index = make_index()
    ingestor = EventIngestor(index, block_size=64)
    feed(ingestor, "pod-a", stored(list(range(1, 9)), TOKENS_128, 16))
    feed(ingestor, "pod-b", stored(list(range(11, 15)), TOKENS_128, 32))
    for key in canonical(TOKENS_128):
        assert pods_at(index, key) == {PodEntry("pod-a"), PodEntry("pod-b")}


def test_tp4_removing_an_unknown_engine_key_is_a_noop(make_index) -> None:
    index = make_index()
    ingestor = EventIngestor(index, block_size=64)
    feed(ingestor, "pod-a", stored([7], TOKENS_128[:64], 64))
    assert feed(ingestor, "pod-a", BlockRemoved([999_999], "GPU")) == "applied"
    assert index.pod_keys("pod-a") == set(canonical(TOKENS_128[:64]))
    assert ingestor.stats.applied["BlockRemoved"] == 1 and not ingestor.stats.errors


def test_tp5_cpu_offload_without_tokens_is_a_tier_update(make_index) -> None:
    index = make_index()
    ingestor = EventIngestor(index, block_size=16)
    tokens, engine = list(range(64)), [41, 42, 43, 44]
    c = canonical(tokens, 16)
    feed(ingestor, "pod-a", stored(engine, tokens, 16))
    feed(ingestor, "pod-a", stored(engine, [], 16, medium="CPU"))
    both = {PodEntry("pod-a", "gpu"), PodEntry("pod-a", "cpu")}
    assert all(pods_at(index, k) == both for k in c) and ingestor.stats.applied["tier_update"] == 1
    feed(ingestor, "pod-a", BlockRemoved(engine, "GPU"))
    assert all(pods_at(index, k) == {PodEntry("pod-a", "cpu")} for k in c)
    assert [index.get_request_key(e) for e in engine] == c  # the CPU copy keeps the mapping
    feed(ingestor, "pod-a", BlockRemoved(engine, "CPU"))
    assert index.pod_keys("pod-a") == set() and [index.get_request_key(e) for e in engine] == [None] * 4


def test_tp6_fewer_tokens_than_a_canonical_block_index_nothing(make_index) -> None:
    index = make_index()
    ingestor = EventIngestor(index, block_size=64)
    assert feed(ingestor, "pod-a", stored([1, 2, 3], list(range(48)), 16)) == "applied"
    assert list(index.items()) == [] and index.get_request_key(1) is None
    assert ingestor.stats.skipped == {"partial_block": 1} and not ingestor.stats.applied


def test_tp7_all_blocks_cleared_clears_only_its_pod(make_index) -> None:
    index = make_index()
    ingestor = EventIngestor(index, block_size=64)
    feed(ingestor, "pod-1", stored([1, 2], TOKENS_128, 64))
    feed(ingestor, "pod-2", stored([3, 4], TOKENS_128, 64))
    feed(ingestor, "pod-1", AllBlocksCleared())
    for key in canonical(TOKENS_128):
        assert pods_at(index, key) == {PodEntry("pod-2")}


def test_tp8_groups_are_separate_entries(make_index) -> None:
    index = make_index()
    ingestor = EventIngestor(index, block_size=64)
    feed(ingestor, "pod-a", stored([1], TOKENS_128[:64], 64, group_idx=0))
    feed(ingestor, "pod-a", stored([2], TOKENS_128[:64], 64, group_idx=1))
    (key,) = canonical(TOKENS_128[:64])
    assert pods_at(index, key) == {PodEntry("pod-a", group=0), PodEntry("pod-a", group=1)}
    feed(ingestor, "pod-a", BlockRemoved([1], "GPU", group_idx=0))
    assert pods_at(index, key) == {PodEntry("pod-a", group=1)}


def test_groups_can_be_ignored() -> None:
    index = InMemoryIndex()
    ingestor = EventIngestor(index, block_size=64, use_groups=False)
    feed(ingestor, "pod-a", stored([1], TOKENS_128[:64], 64, group_idx=3))
    assert pods_at(index, canonical(TOKENS_128[:64])[0]) == {PodEntry("pod-a")}


# ---- keys: parents, roots, LoRA, tails -----------------------------------------------------
def test_a_stored_chain_continues_from_its_parents_request_key() -> None:
    index = InMemoryIndex()
    ingestor = EventIngestor(index, block_size=4)
    tokens = list(range(12))
    feed(ingestor, "pod-a", stored([10, 11], tokens[:8], 4))
    feed(ingestor, "pod-a", stored([12], tokens[8:], 4, parent=11))
    assert index.pod_keys("pod-a") == set(canonical(tokens, 4))
    assert index.get_request_key(12) == canonical(tokens, 4)[2]


def test_a_store_whose_parent_is_unknown_is_skipped_and_counted(make_index) -> None:
    index = make_index()
    ingestor = EventIngestor(index, block_size=4)
    assert feed(ingestor, "pod-a", stored([12], [1, 2, 3, 4], 4, parent=11)) == "applied"
    assert list(index.items()) == [] and ingestor.stats.skipped == {"unknown_parent": 1}


def test_the_topic_gives_pod_and_model_and_lora_replaces_the_model() -> None:
    index = InMemoryIndex()
    ingestor = EventIngestor(index, block_size=4, model_name="ignored-model")
    tokens = list(range(8))
    frames = encode_frames(EventBatch(1.0, [stored([1, 2], tokens, 4)]), topic="kv@pod-7@org/model@v2", seq=0)
    assert ingestor.ingest(decode_frames(frames)) == "applied"
    assert index.pod_keys("pod-7") == set(canonical(tokens, 4, model_name="org/model@v2"))
    feed(ingestor, "pod-8", stored([3, 4], tokens, 4, lora_name="adapter"))
    expected = LlmdHasher(block_size=4, model_name="ignored-model").block_hashes(
        tokens, RequestExtras(lora_name="adapter"))
    assert index.pod_keys("pod-8") == set(expected) and not set(expected) & index.pod_keys("pod-7")


@pytest.mark.parametrize("topic", ["", "kv@pod-1", "kv@@model", "kv@pod@", "xx@pod@model"])
def test_a_malformed_topic_is_refused_naming_it(topic: str) -> None:
    frames = encode_frames(EventBatch(0.0, []), topic=topic)
    with pytest.raises(ValueError, match="topic must be 'kv@<pod-id>@<model>'"):
        EventIngestor(InMemoryIndex()).ingest(decode_frames(frames))
    assert parse_topic("kv@p@m") == ("p", "m")


def test_engine_keys_past_the_last_full_canonical_block_stay_unmapped() -> None:
    index = InMemoryIndex()
    ingestor = EventIngestor(index, block_size=64)
    tokens = list(range(80))  # 5 engine blocks of 16: 4 inside canonical block 0, one in the tail
    feed(ingestor, "pod-a", stored([1, 2, 3, 4, 5], tokens, 16))
    c = canonical(tokens)
    assert [index.get_request_key(e) for e in [1, 2, 3, 4, 5]] == [c[0]] * 4 + [None]
    assert ingestor.stats.unmapped_engine_keys == 1
    feed(ingestor, "pod-a", stored([6], list(range(80, 96)), 16, parent=5))  # its parent is that tail block
    assert ingestor.stats.skipped == {"unknown_parent": 1}


def test_tier_updates_resolve_known_keys_and_count_unknown_ones() -> None:
    index = InMemoryIndex()
    ingestor = EventIngestor(index, block_size=4)
    feed(ingestor, "pod-a", stored([1, 2], list(range(8)), 4))
    feed(ingestor, "pod-a", stored([2, 2, 9], [], 4, medium="CPU"))  # 2 twice (dedup), 9 unknown
    assert index.pod_keys("pod-a", "cpu") == {canonical(list(range(8)), 4)[1]}
    feed(ingestor, "pod-a", stored([8, 9], [], 4, medium="CPU"))
    feed(ingestor, "pod-a", stored([], [], 4))
    assert ingestor.stats.unresolved_engine_keys == 3
    assert ingestor.stats.skipped == {"unresolved_tier_update": 1, "empty": 1}
    assert ingestor.stats.applied == {"BlockStored": 1, "tier_update": 1}


def test_a_tier_scoped_clear_keeps_the_other_tiers() -> None:
    index = InMemoryIndex()
    ingestor = EventIngestor(index, block_size=4)
    feed(ingestor, "pod-a", stored([1], [1, 2, 3, 4], 4))
    feed(ingestor, "pod-a", stored([1], [], 4, medium="CPU"))
    feed(ingestor, "pod-a", AllBlocksCleared("CPU"))
    assert index.pod_tier_counts() == {"pod-a": {"gpu": 1}}
    feed(ingestor, "pod-a", AllBlocksCleared())
    assert index.pod_tier_counts() == {}


def test_stores_with_extra_keys_are_counted() -> None:
    ingestor = EventIngestor(InMemoryIndex(), block_size=4)
    feed(ingestor, "pod-a", stored([1, 2], list(range(8)), 4, extra_keys=[None, None]))
    feed(ingestor, "pod-a", stored([3], list(range(4)), 4, extra_keys=[("img", 0)]))
    assert ingestor.stats.extra_keys_ignored == 1


# ---- a bad event does not stop its batch ---------------------------------------------------
def test_bad_events_are_recorded_and_the_rest_of_the_batch_applied(make_index) -> None:
    index = make_index()
    ingestor = EventIngestor(index, block_size=4)
    batch = EventBatch(0.0, [stored([1], [1, 2, 3, 4], 4),
                             stored([2], [5, 6, 7, 8], 4, parent=1, medium="HBM3"),   # unknown tier
                             stored([3], [9, 9, 9, 9, 9, 9], 6),                       # 6 vs 4: no mapping
                             stored([4], [5, 6, 7, 8], 4, parent=1),
                             BlockRemoved([1], "NVRAM")])                              # unknown tier
    assert ingestor.ingest_batch("pod-a", 5, batch) == "applied"
    assert index.pod_keys("pod-a") == set(canonical([1, 2, 3, 4, 5, 6, 7, 8], 4))
    errors = ingestor.stats.errors
    assert [(e.pod, e.seq, e.event_index, e.event_type) for e in errors] == [
        ("pod-a", 5, 1, "BlockStored"), ("pod-a", 5, 2, "BlockStored"), ("pod-a", 5, 4, "BlockRemoved")]
    assert "hbm3" in errors[0].message and "not multiples of one another" in errors[1].message
    assert ingestor.stats.skipped == {"error": 3} and ingestor.stats.applied == {"BlockStored": 2}


def test_radix_index_rejects_a_parent_the_pod_does_not_hold() -> None:
    index = RadixIndex()
    ingestor = EventIngestor(index, block_size=4)
    feed(ingestor, "pod-a", stored([1], [1, 2, 3, 4], 4))
    feed(ingestor, "pod-b", stored([2], [5, 6, 7, 8], 4, parent=1))  # resolves, but pod-b lacks it
    (error,) = ingestor.stats.errors
    assert error.pod == "pod-b" and error.message.startswith("ParentNotFoundError")


# ---- sequence numbers ---------------------------------------------------------------------
def test_a_gap_is_reported_then_applied_and_late_or_duplicate_batches_are_not() -> None:
    index = InMemoryIndex()
    gaps = []
    ingestor = EventIngestor(index, block_size=4, on_gap=lambda *gap: gaps.append(gap))
    store = EventBatch(0.0, [stored([1], [1, 2, 3, 4], 4)])
    assert ingestor.ingest_batch("pod-a", 0, store) == "applied"
    assert ingestor.ingest_batch("pod-a", 3, EventBatch(3.0, [BlockRemoved([1], "GPU")])) == "gap"
    assert ingestor.ingest_batch("pod-a", 0, store) == "duplicate"  # the store must not come back
    assert ingestor.ingest_batch("pod-a", 2, EventBatch(2.0, [stored([1], [1, 2, 3, 4], 4)])) == "late"
    assert index.pod_keys("pod-a") == set()
    assert gaps == [("pod-a", 1, 3)] and ingestor.stats.gaps == [SeqGap("pod-a", 1, 3)]
    assert ingestor.stats.pods["pod-a"] == {"batches": 2, "gaps": 1, "missed_seqs": 2, "duplicates": 1, "late": 1}
    assert ingestor.stats.batches == {"applied": 1, "gap": 1, "duplicate": 1, "late": 1}
    assert ingestor.stats.last_seq == {("pod-a", None): 3}


def test_a_restarted_publisher_clears_its_pod() -> None:
    index = InMemoryIndex()
    ingestor = EventIngestor(index, block_size=4)
    for pod in ("pod-a", "pod-b"):
        for seq in range(3):
            ingestor.ingest_batch(pod, seq, EventBatch(float(seq), [stored([10 + seq], [seq] * 4, 4)]))
    assert len(index.pod_keys("pod-a")) == 3
    # seq back to 0 with a later publish time: the engine restarted with an empty cache
    assert ingestor.ingest_batch("pod-a", 0, EventBatch(9.0, [stored([20], [7] * 4, 4)])) == "restart"
    assert index.pod_keys("pod-a") == set(canonical([7] * 4, 4)) and len(index.pod_keys("pod-b")) == 3
    assert ingestor.ingest_batch("pod-a", 1, EventBatch(10.0, [])) == "applied"
    # its seq 0 lost: seq 2 after the restart is a restart and a gap from 0
    assert ingestor.ingest_batch("pod-a", 2, EventBatch(20.0, [])) == "applied"
    assert ingestor.ingest_batch("pod-a", 1, EventBatch(30.0, [AllBlocksCleared()])) == "restart"
    assert index.pod_keys("pod-a") == set() and ingestor.stats.gaps == [SeqGap("pod-a", 0, 1)]
    assert ingestor.stats.pods["pod-a"]["restarts"] == 2 and "restarts" not in ingestor.stats.pods["pod-b"]


def test_a_batch_from_before_a_restart_delivered_after_it_is_late() -> None:
    index = InMemoryIndex()
    ingestor = EventIngestor(index, block_size=4)
    ingestor.ingest_batch("pod-a", 5, EventBatch(5.0, []))
    assert ingestor.ingest_batch("pod-a", 0, EventBatch(8.0, [])) == "restart"
    assert ingestor.ingest_batch("pod-a", 1, EventBatch(9.0, [])) == "applied"
    # old seq 6 (ts 6) overtaken by the restarted publisher: ahead in seq, behind in time
    assert ingestor.ingest_batch("pod-a", 6, EventBatch(6.0, [stored([1], [1, 2, 3, 4], 4)])) == "late"
    assert index.pod_keys("pod-a") == set() and ingestor.stats.last_seq == {("pod-a", None): 1}


def test_a_duplicate_of_seq_zero_is_not_a_restart() -> None:
    index = InMemoryIndex()
    ingestor = EventIngestor(index, block_size=4)
    first = EventBatch(5.0, [stored([1], [1, 2, 3, 4], 4)])
    ingestor.ingest_batch("pod-a", 0, first)
    ingestor.ingest_batch("pod-a", 1, EventBatch(6.0, [stored([2], [5, 6, 7, 8], 4, parent=1)]))
    assert ingestor.ingest_batch("pod-a", 0, first) == "duplicate"
    assert len(index.pod_keys("pod-a")) == 2


def test_initial_seq_makes_a_missing_start_a_gap() -> None:
    ingestor = EventIngestor(InMemoryIndex(), initial_seq=0)
    assert ingestor.ingest_batch("pod-a", 3, EventBatch(0.0, [])) == "gap"
    assert ingestor.stats.gaps == [SeqGap("pod-a", 0, 3)]
    assert EventIngestor(InMemoryIndex()).ingest_batch("pod-a", 3, EventBatch(0.0, [])) == "applied"


def test_data_parallel_ranks_are_separate_publishers() -> None:
    ingestor = EventIngestor(InMemoryIndex())
    for seq, rank in [(0, 0), (0, 1), (1, 0), (1, 1), (3, 1)]:
        ingestor.ingest_batch("pod-a", seq, EventBatch(float(seq), [], rank))
    assert ingestor.stats.batches == {"applied": 4, "gap": 1}
    assert ingestor.stats.gaps == [SeqGap("pod-a", 2, 3, 1)]
    assert ingestor.stats.last_seq == {("pod-a", 0): 1, ("pod-a", 1): 3}


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"hasher": LlmdHasher(), "block_size": 16}, "either hasher or"),
    ({"hasher": sim(4)}, "hasher must be an LlmdHasher"),
    ({"block_size": 0}, "block_size"),
    ({"on_gap": 3}, "on_gap must be callable"),
    ({"use_groups": "yes"}, "use_groups must be a bool"),
    ({"initial_seq": -1}, "seq must be an integer"),
])
def test_constructor_checks(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EventIngestor(InMemoryIndex(), **kwargs)


def test_caller_mistakes_raise() -> None:
    ingestor = EventIngestor(InMemoryIndex())
    with pytest.raises(ValueError, match="index must be a kvlab.index.Index"):
        EventIngestor({})
    with pytest.raises(ValueError, match="pod must be a non-empty str, got"):
        ingestor.ingest_batch("", 0, EventBatch(0.0, []))
    with pytest.raises(ValueError, match="seq must be an integer"):
        ingestor.ingest_batch("p", -1, EventBatch(0.0, []))
    with pytest.raises(ValueError, match="batch must be an EventBatch"):
        ingestor.ingest_batch("p", 0, [])
    with pytest.raises(ValueError, match="message must be a DecodedBatch"):
        ingestor.ingest(EventBatch(0.0, []))
    assert EventError("p", 0, 1, "BlockStored", "x").event_index == 1


# ---- consistency with the caches ------------------------------------------------------------
BS = 4  # engine block size == canonical block size
ENGINE = sim(BS)
LLMD = LlmdHasher(block_size=BS)


class PoolDriver:
    """A vLLM KVCacheManager whose events feed an index after every step, and the truth:
    the request keys of the pool's cached blocks (engine key -> request key from the tokens)."""

    def __init__(self, index, free_order: str) -> None:
        self.manager = KVCacheManager(BlockPool(7, block_size=BS, free_order=free_order,
                                                enable_kv_cache_events=True), block_size=BS)
        self.index, self.ingestor = index, EventIngestor(index, block_size=BS)
        self.request_key: dict[int, int] = {}
        self.running: list[Request] = []
        self.ids, self.new_tokens, self.seq = itertools.count(), itertools.count(1000), 0

    def learn(self, request: Request) -> None:
        full = request.num_tokens // BS
        for engine, key in zip(request.block_hashes[:full], LLMD.block_hashes(request.token_ids), strict=True):
            assert self.request_key.setdefault(engine, key) == key

    def admit(self, tokens: list[int]) -> None:
        request = Request.from_tokens(f"r{next(self.ids)}", tokens, ENGINE)
        hits, hit_tokens = self.manager.get_computed_blocks(request)
        if self.manager.allocate_slots(request, len(tokens) - hit_tokens, hit_tokens, hits) is not None:
            self.learn(request)
            self.running.append(request)

    def decode(self, i: int, n: int) -> None:
        request = self.running[i % len(self.running)]
        request.append_tokens([next(self.new_tokens) for _ in range(n)])  # unique: no duplicate blocks
        self.learn(request)
        self.manager.allocate_slots(request, request.num_tokens - request.num_computed_tokens)

    def free(self, i: int) -> None:
        self.manager.free(self.running.pop(i % len(self.running)))

    def step(self) -> None:
        self.ingestor.ingest_batch("pod-0", self.seq, EventBatch(float(self.seq), self.manager.take_events()))
        self.seq += 1

    def truth(self) -> set[int]:
        return {self.request_key[k] for k in self.manager.block_pool.cached_block_hash_to_block}


PROMPTS = st.lists(st.integers(0, 2), min_size=1, max_size=14).filter(lambda t: len(t) % BS)  # unaligned prompts
ADMIT = st.tuples(st.just("admit"), PROMPTS)
FREE = st.tuples(st.just("free"), st.integers(0, 9))
POOL_OP = st.one_of(ADMIT, ADMIT, FREE, FREE, st.tuples(st.just("decode"), st.integers(0, 9), st.integers(1, 6)),
                    st.tuples(st.just("reset")))  # admissions and frees weighted up: eviction pressure
EVICT_OP = st.tuples(st.just("evict"), st.integers(0, 6))


def run_pool_ops(driver: PoolDriver, ops):
    """Apply each op, ingest its events; yields after every step."""
    for op in ops:
        if op[0] == "admit":
            driver.admit(op[1])
        elif op[0] in ("decode", "free") and driver.running:
            getattr(driver, op[0])(*op[1:])
        elif op[0] == "reset":
            driver.manager.reset_prefix_cache()
        elif op[0] == "evict":
            driver.manager.block_pool.evict_blocks([op[1] % driver.manager.block_pool.num_blocks])
        driver.step()
        yield


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(POOL_OP, min_size=20, max_size=60), free_order=st.sampled_from(["current", "classic"]),
       backend=st.sampled_from(["memory", "radix"]))
def test_the_index_equals_the_vllm_pool_after_every_step(ops, free_order: str, backend: str) -> None:
    """With the pool's own LRU eviction (successors go before their parents) the index holds
    exactly the request keys of the cached blocks, on the flat and on the radix backend."""
    driver = PoolDriver(InMemoryIndex() if backend == "memory" else RadixIndex(), free_order)
    for _ in run_pool_ops(driver, ops):
        assert driver.index.pod_keys("pod-0") == driver.truth()
    assert not driver.ingestor.stats.errors and not driver.ingestor.stats.gaps


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.one_of(POOL_OP, EVICT_OP), min_size=20, max_size=60))
def test_with_connector_evictions_the_index_never_claims_an_uncached_block(ops) -> None:
    """``evict_blocks`` can drop a parent under a cached child; then a later store may name
    an unknown parent (skipped, as llm-d does) or recache a block as a second copy (vLLM
    publishes BlockRemoved per copy): the index may miss blocks, never invent them."""
    driver = PoolDriver(InMemoryIndex(), "current")
    for _ in run_pool_ops(driver, ops):
        assert driver.index.pod_keys("pod-0") <= driver.truth()
    assert not driver.ingestor.stats.errors


@pytest.mark.parametrize("backend", ["memory", "radix"])
def test_a_long_random_run_stays_exact(backend: str) -> None:
    """A seeded 400-step run (more pressure than hypothesis's examples), checked every step."""
    rng = np.random.default_rng(7)
    driver = PoolDriver(InMemoryIndex() if backend == "memory" else RadixIndex(), "current")
    kinds = rng.choice(["admit", "decode", "free", "reset"], size=400, p=[0.45, 0.2, 0.3, 0.05])
    ops = [("admit", rng.integers(0, 3, size=int(rng.choice([5, 6, 7, 9, 10, 13]))).tolist()) if kind == "admit"
           else (kind, int(rng.integers(10)), int(rng.integers(1, 7))) if kind == "decode"
           else (kind, int(rng.integers(10))) if kind == "free" else (kind,) for kind in kinds]
    for _ in run_pool_ops(driver, ops):
        assert driver.index.pod_keys("pod-0") == driver.truth()
    applied = driver.ingestor.stats.applied
    assert applied["BlockStored"] > 50 and applied["BlockRemoved"] > 50 and applied["AllBlocksCleared"] > 0


def test_a_second_copy_of_a_block_is_lost_with_the_first_one() -> None:
    """vLLM keeps no single copy per hash and publishes BlockRemoved per evicted copy, so
    the index (a set per key) forgets a block while another copy is still cached."""
    driver = PoolDriver(InMemoryIndex(), "current")
    driver.admit([1, 2, 3, 4, 5])
    driver.step()
    pool = driver.manager.block_pool
    request = Request.from_tokens("copy", [1, 2, 3, 4, 5], ENGINE)
    driver.manager.allocate_slots(request, 5)  # no lookup: block 0 cached again
    driver.step()
    key = request.block_hashes[0]
    first = min(pool.cached_block_hash_to_block[key])
    pool.evict_blocks([first])
    driver.step()
    assert list(pool.cached_block_hash_to_block[key]) != [] and driver.index.pod_keys("pod-0") == set()


class RadixDriver:
    """An SGLang RadixCache (page == canonical block) whose events feed an index."""

    def __init__(self, index) -> None:
        # "lora-a" is a registered LoRA adapter: SGLang names it in its events only then
        self.cache = RadixCache(page_size=BS, enable_kv_cache_events=True, kv_event_lora_names={"lora-a": "lora-a"})
        self.index, self.ingestor, self.seq = index, EventIngestor(index, block_size=BS), 0

    def step(self) -> None:
        self.ingestor.ingest_batch("pod-0", self.seq, EventBatch(float(self.seq), self.cache.take_events()))
        self.seq += 1

    def truth(self) -> set[int]:
        keys, paths = set(), {}
        for node, depth in iter_tree(self.cache.root):
            if depth == 0:
                paths[node.node_id] = []
                continue
            path = paths[node.node_id] = paths[node.parent.node_id] + list(node.key.token_ids)
            extras = RequestExtras(lora_name=node.key.extra_key) if node.key.extra_key else None
            keys.update(LLMD.block_hashes(path, extras))
        return keys


RADIX_KEYS = st.tuples(st.lists(st.integers(0, 2), max_size=16), st.sampled_from([None, "lora-a"]))


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.one_of(st.tuples(st.just("insert"), RADIX_KEYS), st.tuples(st.just("match"), RADIX_KEYS),
                              st.tuples(st.just("evict"), st.integers(0, 12)), st.tuples(st.just("reset"))),
                    min_size=20, max_size=60),
       backend=st.sampled_from(["memory", "radix"]))
def test_the_index_equals_the_sglang_radix_cache_after_every_step(ops, backend: str) -> None:
    driver = RadixDriver(InMemoryIndex() if backend == "memory" else RadixIndex())
    driver.step()
    for op in ops:
        if op[0] in ("insert", "match"):
            key = RadixKey(op[1][0], op[1][1])
            if op[0] == "insert":
                driver.cache.insert(key)
            else:
                driver.cache.match_prefix(key)  # may split a node (no events, page ids kept)
        elif op[0] == "evict":
            driver.cache.evict(op[1])
        else:
            driver.cache.reset()
        driver.step()
        assert driver.index.pod_keys("pod-0") == driver.truth()
    assert not driver.ingestor.stats.errors and not driver.ingestor.stats.skipped
