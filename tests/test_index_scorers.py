"""Scorers over one index: llm-d T-S1..T-S10, Opal T-O1/T-O2 and O12, Dynamo T-D9..T-D11, SGLang's
cache-aware rule, and properties (the lookup stop rule never changes a score; seeds reproduce choices)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.hashing.llmd_hash import LlmdHasher
from kvlab.index.base import Index, entry_sort_key
from kvlab.index.memory import InMemoryIndex
from kvlab.index.scorers import (
    SCORERS,
    CacheAwareScorer,
    DynamoCostScorer,
    LongestPrefixScorer,
    MaxPrefixScorer,
    get_scorer,
    prefix_weights,
    request_keys_for_tokens,
)
from kvlab.index.select import (
    PodLoad,
    dynamo_cost,
    dynamo_cost_2026,
    dynamo_select,
    pick_max,
    sglang_imbalanced,
)
from kvlab.index.types import ENGINE_KEY, KNOWN_TIERS, PodEntry


class DictIndex(Index):
    """A plain dict index; ``scan_all=True`` ignores the lookup stop rule (always llm-d's in-memory scan)."""

    def __init__(self, *, scan_all: bool = False, tiers=KNOWN_TIERS) -> None:
        super().__init__(tiers=tiers)
        self.scan_all = scan_all
        self.data: dict[int, set[PodEntry]] = {}
        self.engine: dict[int, dict[int, int]] = {}

    def _add(self, triples, request_keys, entries, parent):  # noqa: ARG002 - the Index contract's signature
        for engine_key, request_key, position in triples or ():
            self.engine.setdefault(engine_key, {})[request_key] = position
        for key in request_keys:
            self.data.setdefault(key, set()).update(entries)

    def _lookup(self, request_keys, pods, stop_at_miss):
        found = {}
        for key in request_keys:
            kept = [e for e in self.data.get(key, ()) if pods is None or e.pod in pods]
            if kept:
                found[key] = tuple(sorted(kept, key=entry_sort_key))
            elif stop_at_miss and not self.scan_all:
                break
        return found

    def _evict(self, key, key_type, entries):
        keys = list(self.engine.get(key, {})) if key_type == ENGINE_KEY else [key]
        for request_key in keys:
            self.data.get(request_key, set()).difference_update(entries)
            if not self.data.get(request_key, True):
                del self.data[request_key]
        if key_type == ENGINE_KEY and key in self.engine and not any(k in self.data for k in keys):
            del self.engine[key]

    def _clear(self, pod, tier):
        for key in list(self.data):
            self.data[key] = {e for e in self.data[key] if not (e.pod == pod and (tier is None or e.tier == tier))}
            if not self.data[key]:
                del self.data[key]

    def _request_keys_of(self, engine_key):
        positions = self.engine.get(engine_key, {})
        return sorted(positions, key=lambda k: (positions[k], str(k)))

    def _items(self):
        return iter(list(self.data.items()))


BACKENDS = [InMemoryIndex, DictIndex, lambda: DictIndex(scan_all=True)]
A, B = "pod-a", "pod-b"


def gpu(pod):
    return PodEntry(pod, "gpu")


def cpu(pod):
    return PodEntry(pod, "cpu")


def build(backend, placements):
    """An index from ``[(keys, entries), ...]``."""
    index = backend()
    for keys, entries in placements:
        index.add(None, keys, entries)
    return index


def seeds(n=200):
    return [np.random.default_rng(seed) for seed in range(n)]


# ---- llm-d longest prefix (A.8 scorer scenarios) -----------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_t_s1_gpu_and_cpu_on_one_key_count_the_max_weight(backend):
    index = build(backend, [([1001, 1002], [gpu(A)]), ([1003], [gpu(A), cpu(A)]), ([1004, 1005], [cpu(B)]),
                            ([1006], [gpu(A)])])
    scores = LongestPrefixScorer({"gpu": 1.0, "cpu": 0.5}).score(list(range(1001, 1007)), index)
    assert scores == {A: 3.0}


@pytest.mark.parametrize("backend", BACKENDS)
def test_t_s2_cpu_only_key_weighs_the_cpu_weight(backend):
    index = build(backend, [([1001, 1002], [gpu(A)]), ([1003], [cpu(A)]), ([1004, 1005], [cpu(B)]),
                            ([1006], [gpu(A)])])
    scores = LongestPrefixScorer({"gpu": 1.0, "cpu": 0.5}).score(list(range(1001, 1007)), index)
    assert scores == {A: 2.5}


@pytest.mark.parametrize("backend", BACKENDS)
def test_t_s3_to_t_s7(backend):
    scorer = LongestPrefixScorer()
    assert scorer.score([10, 20, 30], build(backend, [([10, 20, 30], [gpu(A)])])) == {A: 3.0}  # T-S3
    index = build(backend, [([10, 20], [gpu(A), gpu(B)]), ([30], [gpu(A)])])
    assert scorer.score([10, 20, 30], index) == {A: 3.0, B: 2.0}  # T-S4
    assert scorer.score([10, 20], build(backend, [([10], [gpu(A)]), ([20], [cpu(A)])])) == {A: pytest.approx(1.8)}
    index = build(backend, [([10, 20], [gpu(A), gpu(B)])])
    assert scorer.score([10, 20], index, [A]) == {A: 2.0}  # T-S6
    index = build(backend, [([10], [gpu(A), gpu(B)]), ([20], [gpu(A)]), ([30], [gpu(A), gpu(B)])])
    assert scorer.score([10, 20, 30], index) == {A: 3.0, B: 1.0}  # T-S7: B's break at 20 ends its run


def test_t_s7_both_lookup_maps_score_the_same():
    index = build(InMemoryIndex, [([10], [gpu(A), gpu(B)]), ([20], [gpu(A)]), ([30], [gpu(A), gpu(B)])])
    scorer = LongestPrefixScorer()
    for pods in (None, [B]):
        prefix_map = index.lookup([10, 20, 30], pods)
        full_map = index.lookup([10, 20, 30], pods, stop="never")
        assert scorer.score_lookup([10, 20, 30], prefix_map, pods) == scorer.score_lookup([10, 20, 30], full_map, pods)
    assert scorer.score_lookup([10, 20, 30], index.lookup([10, 20, 30], [B], stop="never"), [B]) == {B: 1.0}
    # a gap at key 20 for everyone: the full map still holds key 30, the score ignores it
    index = build(InMemoryIndex, [([10, 30], [gpu(A)])])
    assert set(index.lookup([10, 20, 30], stop="never")) == {10, 30}
    assert scorer.score([10, 20, 30], index) == {A: 1.0}


def test_t_s8_no_tokens_and_no_keys_give_empty_scores():
    index = build(InMemoryIndex, [([10], [gpu(A)])])
    assert LongestPrefixScorer().score_tokens([], index, LlmdHasher(block_size=4)) == {}
    assert LongestPrefixScorer().score_tokens([1, 2, 3], index, LlmdHasher(block_size=4)) == {}  # no full block
    assert LongestPrefixScorer().score([], index) == {}


@pytest.mark.parametrize("backend", BACKENDS)
def test_t_s9_keys_without_entries_give_empty_scores(backend):
    index = build(backend, [([10, 20], [gpu(A)])])
    index.evict(10, "request", [gpu(A)])  # key 10 left without entries
    assert LongestPrefixScorer().score([10, 20], index) == {}
    assert LongestPrefixScorer().score([77, 78], index) == {}


class RecordingHasher(LlmdHasher):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seen: list[list[int]] = []

    def block_hashes(self, token_ids, extras=None, parent_key=0):
        self.seen.append([int(t) for t in token_ids])
        return super().block_hashes(token_ids, extras, parent_key)


def test_t_s10_truncation_keeps_the_last_tokens():
    hasher = RecordingHasher(block_size=1)
    tokens = [11, 12, 13, 14, 15]
    assert request_keys_for_tokens(tokens, hasher, truncate_prompt_tokens=3) == LlmdHasher(
        block_size=1).block_hashes([13, 14, 15])
    assert hasher.seen == [[13, 14, 15]]
    index = build(InMemoryIndex, [(LlmdHasher(block_size=1).block_hashes([13, 14, 15]), [gpu(A)])])
    assert LongestPrefixScorer().score_tokens(tokens, index, hasher, truncate_prompt_tokens=3) == {A: 3.0}
    assert LongestPrefixScorer().score_tokens(tokens, index, hasher) == {}  # the whole prompt chains differently
    # 0 and N >= len(tokens) do not truncate
    for n in (0, 5, 9):
        assert request_keys_for_tokens(tokens, hasher, truncate_prompt_tokens=n) == hasher.block_hashes(tokens)


def test_a_pod_in_several_tiers_counts_its_best_tier_whatever_the_entry_order():
    index = build(InMemoryIndex, [([10, 20], [PodEntry(A, "gpu"), PodEntry(A, "disk"), PodEntry(A, "cpu")])])
    assert LongestPrefixScorer({"gpu": 0.2, "cpu": 0.9, "disk": 0.5}).score([10, 20], index) == {A: 1.8}
    assert LongestPrefixScorer({"gpu": 0.2, "cpu": 0.1, "disk": 0.5}).score([10, 20], index) == {A: 1.0}


def test_tier_weights_unknown_tier_scores_one_but_an_unknown_name_is_rejected():
    index = build(InMemoryIndex, [([10], [PodEntry(A, "disk")]), ([20], [PodEntry(A, "cpu_pinned")])])
    assert LongestPrefixScorer().score([10, 20], index) == {A: 2.0}
    assert LongestPrefixScorer({"disk": 0.25}).score([10, 20], index) == {A: 1.25}
    for weights in ({"GPU": 1.0}, {"hbm": 1.0}, {"gpu": -1.0}, {"gpu": float("nan")}, {"gpu": True}):
        with pytest.raises(ValueError, match="tier"):
            LongestPrefixScorer(weights)
    custom = InMemoryIndex(tiers=("hbm", "dram"))
    custom.add(None, [10, 20], [PodEntry(A, "hbm")])
    custom.add(None, [20], [PodEntry(B, "dram")])
    scorer = LongestPrefixScorer({"hbm": 1.0, "dram": 0.5}, tiers=custom.tiers)
    assert scorer.score([10, 20], custom) == {A: 2.0}
    assert scorer.score([20], custom) == {A: 1.0, B: 0.5}


def test_speculative_and_grouped_entries_score_like_confirmed_ones():
    index = InMemoryIndex()
    index.add_speculative([10, 20], A, now_s=0.0)
    index.add(None, [10, 20], [PodEntry(B, group=1)])
    assert LongestPrefixScorer().score([10, 20], index) == {A: 2.0, B: 2.0}
    index.expire(5.0)
    assert LongestPrefixScorer().score([10, 20], index) == {B: 2.0}


# ---- Opal MaxPrefix (B.2, B.8) ------------------------------------------------------------
H1, H2, H3, H4 = 101, 102, 103, 104


@pytest.mark.parametrize("backend", BACKENDS)
def test_t_o1_matched_fraction(backend):
    index = build(backend, [([H1, H2, H3], [gpu("1")])])
    assert MaxPrefixScorer().score([H1, H2, H4], index) == {"1": pytest.approx(2 / 3)}
    assert MaxPrefixScorer().score([H1, H2, H4], index, ["2"]) == {}


@pytest.mark.parametrize("backend", BACKENDS)
def test_t_o2_candidate_scoring_zero_falls_back_to_random(backend):
    index = build(backend, [([H2, H3], [gpu("1")])])
    assert MaxPrefixScorer().score([H1, H2, H3], index) == {"1": 0.0}
    pods = ["1", "2", "3"]
    choices = [MaxPrefixScorer().select([H1, H2, H3], index, pods, rng=rng) for rng in seeds()]
    # the fallback is exactly one uniform draw over the given pods
    assert choices == [pods[int(np.random.default_rng(seed).integers(3))] for seed in range(200)]
    assert set(choices) == set(pods)
    assert MaxPrefixScorer().select([H1], index, pods, rng=np.random.default_rng(0)) in pods  # no scores at all


def test_o5_ties_at_the_max_are_uniform_and_lower_scores_never_win():
    index = build(InMemoryIndex, [([H1, H2], [gpu("1"), gpu("2")]), ([H1], [gpu("3")])])
    choices = Counter(MaxPrefixScorer().select([H1, H2], index, ["1", "2", "3"], rng=rng) for rng in seeds())
    assert set(choices) == {"1", "2"} and min(choices.values()) > 60


def test_o12_a_stored_prefix_is_found_with_one_integer_key_on_both_sides():
    hasher = LlmdHasher(block_size=4, model_name="m")
    tokens = list(range(100, 116))
    index = InMemoryIndex()
    index.add(None, list(hasher.block_keys(tokens)), [gpu("w1")])  # the event side
    scorer = MaxPrefixScorer()
    assert scorer.score_tokens(tokens + [1, 2, 3, 4], index, hasher) == {"w1": pytest.approx(0.8)}
    keys = request_keys_for_tokens(tokens, hasher)
    assert all(type(key) is int for key in keys)
    assert {scorer.select(keys, index, ["w0", "w1", "w2"], rng=rng) for rng in seeds(50)} == {"w1"}
    with pytest.raises(ValueError):  # a digest of another type cannot sneak in and never match
        index.add(None, [hasher.block_hashes(tokens)[0].to_bytes(8, "big")], [gpu("w2")])


# ---- Dynamo (C.2, C.3) ----------------------------------------------------------------------
def test_t_d9_temperature_zero_picks_the_lowest_cost():
    costs = {"w0": 5.0, "w1": 3.0, "w2": 7.0, "w3": 3.5}
    assert {dynamo_select(costs, rng) for rng in seeds(50)} == {"w1"}
    tied = {"w0": 5.0, "w1": 3.0, "w2": 3.0, "w3": 3.5}
    assert {dynamo_select(tied, rng) for rng in seeds(50)} == {"w1", "w2"}
    assert {dynamo_select({"a": -1.0, "b": -5.0, "c": 0.0}, rng) for rng in seeds(20)} == {"b"}
    assert {dynamo_select(tied, rng, tree_sizes={"w1": 9, "w2": 4}) for rng in seeds(20)} == {"w2"}
    assert dynamo_select({}, np.random.default_rng(0)) is None


def test_d9_softmax_draws_by_range_normalised_costs():
    costs = {"a": 0.0, "b": 1.0, "c": 2.0}
    rng = np.random.default_rng(7)
    counts = Counter(dynamo_select(costs, rng, temperature=1.0) for _ in range(20_000))
    weights = np.exp([-0.0, -0.5, -1.0])
    for pod, p in zip("abc", weights / weights.sum()):
        assert counts[pod] / 20_000 == pytest.approx(p, abs=0.015)
    equal = Counter(dynamo_select({"a": 4.0, "b": 4.0}, rng, temperature=0.5) for _ in range(2_000))
    assert equal["a"] / 2_000 == pytest.approx(0.5, abs=0.05)
    cold = Counter(dynamo_select(costs, rng, temperature=0.05) for _ in range(2_000))
    assert cold["a"] > 1_990  # p(b) = exp(-10) / (1 + ...)


def test_t_d10_docs_example_and_the_same_rule_over_an_index():
    costs = {"W1": dynamo_cost(8, 10), "W2": dynamo_cost(5, 5), "W3": dynamo_cost(2, 9)}
    assert costs == {"W1": 18.0, "W2": 10.0, "W3": 11.0}
    assert dynamo_select(costs, np.random.default_rng(0)) == "W2"
    keys = list(range(1, 11))
    index = build(InMemoryIndex, [(keys[:2], [gpu("W1")]), (keys[:5], [gpu("W2")]), (keys[:8], [cpu("W3")])])
    loads = {"W1": PodLoad(), "W2": PodLoad(), "W3": PodLoad(active_blocks=4)}
    scorer = DynamoCostScorer()
    # prefill = 10 - overlap, decode = active + 10
    assert scorer.score(keys, index, loads=loads) == {"W1": 18.0, "W2": 15.0, "W3": 16.0}
    assert scorer.select(keys, index, ["W1", "W2", "W3"], loads=loads, rng=np.random.default_rng(0)) == "W2"
    assert DynamoCostScorer(overlap_weight=2.0).score(keys, index, ["W3"], loads=loads) == {"W3": 18.0}
    queued = {"W2": PodLoad(queued_prefill_blocks=4)}
    assert scorer.score(keys, index, ["W2"], loads=queued) == {"W2": 19.0}


def test_dynamo_pure_load_balancing_ties_go_to_the_smallest_tree():
    keys = [1, 2, 3]
    index = build(InMemoryIndex, [(keys, [gpu("W1")])])
    loads = {"W1": PodLoad(tree_size_blocks=30), "W2": PodLoad(tree_size_blocks=3)}
    scorer = DynamoCostScorer(overlap_weight=0.0)
    assert scorer.score(keys, index, ["W1", "W2"], loads=loads) == {"W1": 3.0, "W2": 3.0}
    assert {scorer.select(keys, index, ["W1", "W2"], loads=loads, rng=rng) for rng in seeds(30)} == {"W2"}
    assert scorer.score(keys, index) == {"W1": 3.0}  # no pods, no loads: the pods holding key 0


def test_dynamo_without_pods_scores_the_loads_pods_and_every_pod_holding_the_prefix():
    keys = [1, 2, 3, 4]
    index = build(InMemoryIndex, [(keys[:2], [gpu("pod-b"), gpu("pod-a")]), (keys[1:], [gpu("pod-c")])])
    loads = {"pod-z": PodLoad(active_blocks=1), "pod-b": PodLoad(active_blocks=2)}
    # prefill = 4 - overlap, decode = active + 4; pod-c misses key 0 (no overlap) and has no load: not scored
    assert DynamoCostScorer().score(keys, index, loads=loads) == {"pod-z": 9.0, "pod-b": 8.0, "pod-a": 6.0}
    assert list(DynamoCostScorer().score(keys, index, loads=loads)) == ["pod-z", "pod-b", "pod-a"]
    assert DynamoCostScorer().score(keys, index, ["pod-c", "pod-z"], loads=loads) == {"pod-c": 8.0, "pod-z": 9.0}


def test_t_d11_2026_formula_shared_cache_credit():
    # upstream selector test: W0 caches 2 of 4 on device, the shared store holds all 4
    w0 = dynamo_cost_2026(4, 0, device_overlap_blocks=2, shared_beyond_blocks=2, shared_cache_multiplier=0.5)
    w1 = dynamo_cost_2026(4, 0, shared_beyond_blocks=4, shared_cache_multiplier=0.5)
    assert (w0, w1) == (1.0, 2.0)
    assert dynamo_select({"W0": w0, "W1": w1}, np.random.default_rng(0)) == "W0"
    # the spec's numbers (W0 3, W1 2 -> W1): W0 also carries 2 decode blocks
    w0_busy = dynamo_cost_2026(4, 2, device_overlap_blocks=2, shared_beyond_blocks=2, shared_cache_multiplier=0.5)
    assert (w0_busy, w1) == (3.0, 2.0)
    assert dynamo_select({"W0": w0_busy, "W1": w1}, np.random.default_rng(0)) == "W1"
    # host blocks credit 0.75 each; the scale applies after the credit, clamped at 0
    assert dynamo_cost_2026(8, 1, device_overlap_blocks=2, host_overlap_blocks=4) == 8 - 2 - 3 + 1
    assert dynamo_cost_2026(4, 5, device_overlap_blocks=6, prefill_load_scale=2.0) == 5.0
    assert dynamo_cost_2026(0, 100, active_requests=4, decode_active_request_weight=32.0) == 228.0
    with pytest.raises(ValueError, match="host_overlap_blocks"):
        dynamo_cost_2026(4, 0, host_overlap_blocks=-1)


# ---- SGLang cache-aware (engines.md §2.3) ------------------------------------------------
KEYS10 = list(range(1, 11))


def cache_aware_index(a_blocks, b_blocks=0):
    placements = [(KEYS10[:a_blocks], [gpu(A)])] if a_blocks else []
    return build(InMemoryIndex, placements + ([(KEYS10[:b_blocks], [gpu(B)])] if b_blocks else []))


def test_sglang_imbalance_routes_to_the_least_loaded_despite_the_cache():
    index = cache_aware_index(10)
    scorer = CacheAwareScorer()
    loaded = {A: PodLoad(running_requests=100), B: PodLoad(running_requests=10)}
    assert scorer.select(KEYS10, index, [A, B], loads=loaded, rng=np.random.default_rng(0)) == B
    for a_load, b_load in ((1000, 900), (30, 1)):  # only one of the two conditions holds: balanced
        loads = {A: PodLoad(running_requests=a_load), B: PodLoad(running_requests=b_load)}
        assert not sglang_imbalanced([a_load, b_load], abs_threshold=64, rel_threshold=1.5)
        assert scorer.select(KEYS10, index, [A, B], loads=loads, rng=np.random.default_rng(0)) == A
    assert sglang_imbalanced([65, 0], abs_threshold=64, rel_threshold=1.5)
    assert not sglang_imbalanced([64, 0], abs_threshold=64, rel_threshold=1.5)
    three = {A: PodLoad(running_requests=100), B: PodLoad(running_requests=0), "c": PodLoad(running_requests=0)}
    assert {scorer.select(KEYS10, index, [A, B, "c"], loads=three, rng=rng) for rng in seeds(40)} == {B, "c"}


def test_sglang_threshold_is_strict_then_smallest_tree_or_least_loaded():
    scorer = CacheAwareScorer()
    loads = {A: PodLoad(running_requests=0, tree_size_blocks=50), B: PodLoad(running_requests=3, tree_size_blocks=5)}
    assert scorer.score(KEYS10, cache_aware_index(3)) == {A: pytest.approx(0.3)}
    assert scorer.select(KEYS10, cache_aware_index(3), [A, B], loads=loads, rng=np.random.default_rng(0)) == B
    assert scorer.select(KEYS10, cache_aware_index(4), [A, B], loads=loads, rng=np.random.default_rng(0)) == A
    least_loaded = CacheAwareScorer(fallback="least_loaded")
    assert least_loaded.select(KEYS10, cache_aware_index(3), [A, B], loads=loads, rng=np.random.default_rng(0)) == A
    assert CacheAwareScorer(cache_threshold=0.0).select(KEYS10, cache_aware_index(1), [A, B], loads=loads,
                                                        rng=np.random.default_rng(0)) == A
    assert {scorer.select([], cache_aware_index(3), [A, B], rng=rng) for rng in seeds(40)} == {A, B}


def test_sglang_best_match_ties_by_load_then_tree_then_random():
    index = cache_aware_index(8, 8)
    scorer = CacheAwareScorer()
    by_load = {A: PodLoad(running_requests=2), B: PodLoad(running_requests=1, tree_size_blocks=99)}
    assert scorer.select(KEYS10, index, [A, B], loads=by_load, rng=np.random.default_rng(0)) == B
    by_tree = {A: PodLoad(tree_size_blocks=1), B: PodLoad(tree_size_blocks=9)}
    assert scorer.select(KEYS10, index, [A, B], loads=by_tree, rng=np.random.default_rng(0)) == A
    assert {scorer.select(KEYS10, index, [A, B, "c"], rng=rng) for rng in seeds(40)} == {A, B}
    assert scorer.select(KEYS10, cache_aware_index(6, 8), [A, B], loads=by_tree, rng=np.random.default_rng(0)) == B


# ---- contract, registry, bad input --------------------------------------------------------
def test_registry_and_the_common_contract():
    assert sorted(SCORERS) == ["cache_aware", "dynamo_cost", "longest_prefix", "max_prefix"]
    assert isinstance(get_scorer("Max_Prefix"), MaxPrefixScorer)
    assert get_scorer("dynamo_cost", temperature=0.5).temperature == 0.5
    assert [SCORERS[name].lower_is_better for name in sorted(SCORERS)] == [False, True, False, False]
    with pytest.raises(ValueError, match="known scorers"):
        get_scorer("balanced")
    with pytest.raises(ValueError, match="bad options"):
        get_scorer("max_prefix", temperature=1.0)
    index = build(InMemoryIndex, [([1, 2], [gpu(A)])])
    for name in SCORERS:
        scorer = get_scorer(name)
        assert scorer.select([1, 2], index, [], rng=np.random.default_rng(0)) is None
        twice = f"pods lists {A!r} twice \\(pods\\[0\\] and pods\\[2\\]\\)"
        with pytest.raises(ValueError, match=f"^{twice}$"):
            scorer.select([1, 2], index, [A, "b", A], rng=np.random.default_rng(0))
        with pytest.raises(ValueError, match=f"^{twice}$"):
            scorer.score([1, 2], index, [A, "b", A])
        with pytest.raises(ValueError, match="rng"):
            scorer.select([1, 2], index, [A], rng=0)
        with pytest.raises(ValueError, match="pods"):
            scorer.select([1, 2], index, A, rng=np.random.default_rng(0))
        with pytest.raises(ValueError, match="loads"):
            scorer.score([1, 2], index, loads={A: 3})
        with pytest.raises(ValueError, match="request_keys"):
            scorer.score([0], index)


def test_bad_configuration_and_loads_are_rejected():
    for kwargs in ({"cache_threshold": 1.5}, {"balance_abs_threshold": -1}, {"fallback": "random"}):
        with pytest.raises(ValueError):
            CacheAwareScorer(**kwargs)
    for kwargs in ({"overlap_weight": -1.0}, {"temperature": float("inf")}):
        with pytest.raises(ValueError):
            DynamoCostScorer(**kwargs)
    with pytest.raises(ValueError, match="running_requests"):
        PodLoad(running_requests=1.5)
    with pytest.raises(ValueError, match="active_blocks"):
        PodLoad(active_blocks=-1)
    with pytest.raises(ValueError, match="truncate_prompt_tokens"):
        request_keys_for_tokens([1, 2], LlmdHasher(block_size=1), truncate_prompt_tokens=-1)
    with pytest.raises(ValueError, match="hasher"):
        request_keys_for_tokens([1, 2], object())
    with pytest.raises(ValueError, match="costs"):
        dynamo_select({"a": float("nan")}, np.random.default_rng(0))


# ---- properties ------------------------------------------------------------------------------
PODS = ["p0", "p1", "p2"]
TIERS = ["gpu", "cpu", "disk"]
OPS = st.lists(st.one_of(
    st.tuples(st.just("add"), st.sampled_from(PODS), st.sampled_from(TIERS), st.lists(st.integers(1, 8), min_size=1,
                                                                                       max_size=5)),
    st.tuples(st.just("evict"), st.sampled_from(PODS), st.sampled_from(TIERS), st.integers(1, 8)),
    st.tuples(st.just("clear"), st.sampled_from(PODS), st.none(), st.none()),
), max_size=25)
REQUEST = st.lists(st.integers(1, 8), min_size=0, max_size=8, unique=True)


def apply(index, ops):
    for op, pod, tier, arg in ops:
        if op == "add":
            index.add(None, arg, [PodEntry(pod, tier)])
        elif op == "evict":
            index.evict(arg, "request", [PodEntry(pod, tier)])
        else:
            index.clear(pod)
    return index


def naive_longest_prefix(keys, index, weights):
    """Per pod: walk the keys from 0 while the pod holds the key, adding its best tier weight."""
    held = {key: entries for key, entries in index.items()}
    scores = {}
    for pod in {e.pod for e in held.get(keys[0], ())} if keys else ():
        total = 0.0
        for key in keys:
            mine = [weights.get(e.tier, 1.0) for e in held.get(key, ()) if e.pod == pod]
            if not mine:
                break
            total += max(mine)
        scores[pod] = total
    return scores


@given(OPS, REQUEST, st.sampled_from([None, ["p0"], ["p1", "p2"]]))
def test_scores_do_not_depend_on_the_lookup_stop_rule(ops, keys, pods):
    stopping, scanning = apply(InMemoryIndex(), ops), apply(DictIndex(scan_all=True), ops)
    loads = {pod: PodLoad(active_blocks=i, running_requests=i) for i, pod in enumerate(PODS)}
    for name in SCORERS:
        scorer = get_scorer(name)
        assert scorer.score(keys, stopping, pods, loads=loads) == scorer.score(keys, scanning, pods, loads=loads)
        if keys:
            prefix_map, full_map = (stopping.lookup(keys, pods, stop=stop) for stop in ("first_miss", "never"))
            by_prefix = scorer.score_lookup(keys, prefix_map, pods, loads)
            by_full = scorer.score_lookup(keys, full_map, pods, loads)
            # MaxPrefix's zero-score candidates come from keys past a gap, which only the full map holds
            assert {p: s for p, s in by_prefix.items() if s} == {p: s for p, s in by_full.items() if s}
            if name != "max_prefix":
                assert by_prefix == by_full


@given(OPS, REQUEST, st.dictionaries(st.sampled_from(TIERS), st.floats(0, 1), max_size=3))
def test_longest_prefix_equals_the_naive_walk_and_is_bounded(ops, keys, weights):
    index = apply(InMemoryIndex(), ops)
    scores = LongestPrefixScorer(weights).score(keys, index)
    assert scores == pytest.approx(naive_longest_prefix(keys, index, weights))
    assert all(0 <= score <= len(keys) for score in scores.values())
    assert prefix_weights(keys, {}, lambda _entry: 1.0) == {}


@given(OPS, REQUEST, st.integers(0, 2**32 - 1), st.sampled_from(sorted(SCORERS)), st.floats(0, 2))
def test_seeded_selection_is_reproducible(ops, keys, seed, name, temperature):
    index = apply(InMemoryIndex(), ops)
    loads = {pod: PodLoad(running_requests=3 * i, tree_size_blocks=i % 2) for i, pod in enumerate(PODS)}
    scorer = DynamoCostScorer(temperature=temperature) if name == "dynamo_cost" else get_scorer(name)
    first = scorer.select(keys, index, PODS, loads=loads, rng=np.random.default_rng(seed))
    again = scorer.select(keys, index, PODS, loads=loads, rng=np.random.default_rng(seed))
    assert first == again and first in PODS
    other = apply(DictIndex(scan_all=True), ops)
    assert scorer.select(keys, other, PODS, loads=loads, rng=np.random.default_rng(seed)) == first


@given(st.dictionaries(st.sampled_from(PODS), st.floats(0, 5), max_size=3), st.integers(0, 1000))
def test_pick_max_only_returns_a_pod_at_the_max(scores, seed):
    choice = pick_max(scores, PODS, np.random.default_rng(seed))
    assert scores.get(choice, 0.0) == max([scores.get(pod, 0.0) for pod in PODS])
