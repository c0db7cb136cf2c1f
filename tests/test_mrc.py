"""Miss-ratio curves: one Mattson pass equals a replay at every capacity; SHARDS sampling."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from conftest import chained_traces, make_trace
from kvlab.sim import replay, sweep
from kvlab.sim.mrc import DEFAULT_GRID_POINTS, mrc
from kvlab.sim.mrc_kernel import SHARDS_MODULUS, shards_keep, splitmix64

TOUCH = st.sampled_from(["head_most_recent", "tail_most_recent"])
SCENARIO = [[10, 11, 12], [10, 11, 13], [10, 14], [10, 11, 12]]
#: docs/specs/traces.md §5 capacities (blocks), plus 0, a tiny cache and unbounded
SPEC_CAPACITIES = [0, 20, 1_000, 5_000, 5_859, 10_000, 30_000, 50_000, 97_656, 100_000, None]


@given(trace=chained_traces(), touch=TOUCH, warmup=st.floats(0.0, 0.95))
def test_equals_a_replay_at_every_capacity(trace, touch, warmup) -> None:
    """Every capacity 0..working set + 1 and unbounded: the whole sweep row — block hits,
    token ratio, evictions — equals a separate replay's (``sweep`` = ``run_kernel`` +
    ``summarize`` per capacity, the core of :func:`kvlab.sim.replay`)."""
    capacities = [*range(trace.distinct_blocks + 2), None]
    curve = mrc(trace, capacities_blocks=capacities, touch_order=touch, warmup_fraction=warmup)
    assert_frame_equal(curve, sweep(trace, capacities, touch_order=touch, warmup_fraction=warmup))


@given(trace=chained_traces(), touch=TOUCH, warmup=st.floats(0.0, 0.95),
       capacity=st.one_of(st.none(), st.integers(0, 80)))
def test_row_equals_replay_summary(trace, touch, warmup, capacity) -> None:
    row = mrc(trace, capacities_blocks=[capacity], touch_order=touch, warmup_fraction=warmup).row(0, named=True)
    s = replay(trace, capacity_blocks=capacity, touch_order=touch, warmup_fraction=warmup).summary
    assert (row["block_refs"], row["hit_blocks"], row["evictions"]) == (s.block_refs, s.hit_blocks, s.evictions)
    assert (row["block_hit_ratio"], row["token_hit_ratio"]) == (s.block_hit_ratio, s.token_hit_ratio)


@given(keys=st.lists(st.lists(st.integers(0, 6), max_size=6), min_size=1, max_size=12), touch=TOUCH)
def test_unchained_keys_and_repeats_within_a_request(keys, touch) -> None:
    """Stack distances need no chaining: lookups see the state before the request, and a
    key repeated inside a request is accessed twice, as the replay does."""
    trace = make_trace(keys, block_size=2)
    capacities = [*range(trace.distinct_blocks + 2), None]
    assert_frame_equal(mrc(trace, capacities_blocks=capacities, touch_order=touch),
                       sweep(trace, capacities, touch_order=touch))


@pytest.mark.parametrize("name", ["conversation", "synthetic"])
@pytest.mark.parametrize("touch", ["head_most_recent", "tail_most_recent"])
@pytest.mark.parametrize("warmup", [0.0, 0.5])
def test_bundled_traces_equal_replay(request, name, touch, warmup) -> None:
    trace = request.getfixturevalue(name)
    curve = mrc(trace, capacities_blocks=SPEC_CAPACITIES, touch_order=touch, warmup_fraction=warmup)
    for row in curve.iter_rows(named=True):
        s = replay(trace, capacity_blocks=row["capacity_blocks"], touch_order=touch, warmup_fraction=warmup).summary
        assert (row["block_refs"], row["hit_blocks"], row["evictions"]) == (s.block_refs, s.hit_blocks, s.evictions)
        assert (row["block_hit_ratio"], row["token_hit_ratio"]) == (s.block_hit_ratio, s.token_hit_ratio)
        assert round(row["token_hit_ratio"] * s.input_tokens) == s.hit_tokens


# docs/specs/traces.md §5.1 and §5.3 (forward touch order = tail most recent): block, token
SPEC_5_1 = {
    "conversation": {1_000: (0.0445, 0.0454), 5_000: (0.1104, 0.1125), 5_859: (0.1355, 0.1382),
                     10_000: (0.2112, 0.2153), 30_000: (0.3257, 0.3321), 50_000: (0.3546, 0.3615),
                     97_656: (0.3635, 0.3707), 100_000: (0.3637, 0.3708), None: (0.3664, 0.3736)},
    "synthetic": {1_000: (0.0825, 0.0840), 5_000: (0.2791, 0.2843), 5_859: (0.3094, 0.3151),
                  10_000: (0.4235, 0.4313), 30_000: (0.6242, 0.6356), 50_000: (0.6396, 0.6512),
                  97_656: (0.6396, 0.6512), 100_000: (0.6396, 0.6512), None: (0.6396, 0.6512)},
}
SPEC_5_3 = {
    "conversation": {1_000: (0.0458, 0.0467), 5_000: (0.1103, 0.1125), 10_000: (0.2144, 0.2188),
                     30_000: (0.3368, 0.3438), 50_000: (0.3690, 0.3767), 100_000: (0.3842, 0.3922),
                     None: (0.3900, 0.3981)},
    "synthetic": {1_000: (0.1261, 0.1280), 5_000: (0.4109, 0.4168), 10_000: (0.5952, 0.6036),
                  30_000: (0.8264, 0.8378), 50_000: (0.8511, 0.8627), 100_000: (0.8511, 0.8627),
                  None: (0.8511, 0.8627)},
}


@pytest.mark.parametrize("name", ["conversation", "synthetic"])
@pytest.mark.parametrize(("warmup", "table"), [(0.0, SPEC_5_1), (0.5, SPEC_5_3)])
def test_spec_numbers(request, name, warmup, table) -> None:
    """The independently computed LRU numbers of docs/specs/traces.md §5 (4 decimals)."""
    expected = table[name]
    curve = mrc(request.getfixturevalue(name), capacities_blocks=list(expected), touch_order="tail_most_recent",
                warmup_fraction=warmup)
    got = {c: (round(b, 4), round(t, 4)) for c, b, t in curve.select(
        "capacity_blocks", "block_hit_ratio", "token_hit_ratio").rows()}
    assert got == expected


def test_golden_scenario() -> None:
    """SCENARIO at capacity 3 (tests/test_sim_replay.py): hits 0, 2, 1, 2 head most recent,
    0, 2, 1, 1 tail most recent; 4 evictions either way; unbounded 0, 2, 1, 3."""
    trace = make_trace(SCENARIO, block_size=1)
    head = mrc(trace, capacities_blocks=[0, 3, None])
    tail = mrc(trace, capacities_blocks=[3], touch_order="tail_most_recent")
    assert head["hit_blocks"].to_list() == [0, 5, 6]
    assert head["evictions"].to_list() == [0, 4, 0]
    assert tail["hit_blocks"].to_list() == [4] and tail["evictions"].to_list() == [4]


def test_token_hits_count_the_last_block_remainder() -> None:
    trace = make_trace([[1, 2, 3], [1, 2, 3], [1, 2, 9]], block_size=4, input_tokens=[10, 10, 12])
    row = mrc(trace, capacities_blocks=[None]).row(0, named=True)
    assert (row["hit_blocks"], row["block_refs"]) == (5, 9)
    assert row["token_hit_ratio"] == 18 / 32


def test_default_grid_is_log_spaced_up_to_the_working_set(conversation) -> None:
    caps = mrc(conversation)["capacity_blocks"].to_list()
    assert caps[-1] is None
    bounded = caps[:-1]
    assert bounded[0] == 1 and bounded[-1] == conversation.distinct_blocks
    assert bounded == sorted(set(bounded)) and len(bounded) <= DEFAULT_GRID_POINTS
    ratios = np.diff(np.log(bounded[-50:]))
    assert np.allclose(ratios, ratios.mean(), rtol=0.05)  # geometric where rounding no longer merges points
    assert mrc(make_trace([[1, 2], [1, 3]]))["capacity_blocks"].to_list() == [1, 2, 3, None]
    assert mrc(make_trace([[]]))["capacity_blocks"].to_list() == [None]


def test_capacities_keep_order_and_duplicates_and_must_not_be_empty() -> None:
    trace = make_trace(SCENARIO, block_size=1)
    curve = mrc(trace, capacities_blocks=(c for c in [None, 3, np.int64(1), 3, 10**15]))
    assert curve["capacity_blocks"].to_list() == [None, 3, 1, 3, 10**15]
    assert curve["hit_blocks"].to_list() == [6, 5, 3, 5, 6]
    assert curve.schema == sweep(trace, [3]).schema
    with pytest.raises(ValueError, match="capacities_blocks is empty"):
        mrc(trace, capacities_blocks=[])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"capacities_blocks": [3, -1]}, "capacities_blocks[1] must be an integer in [0, 2**63) or None, got -1"),
    ({"capacities_blocks": [2.5]}, "capacities_blocks[0] must be an integer in [0, 2**63) or None, got 2.5"),
    ({"capacities_blocks": [True]}, "capacities_blocks[0] must be an integer in [0, 2**63) or None, got True"),
    ({"capacities_blocks": [2**63]}, "capacities_blocks[0] must be an integer in [0, 2**63) or None"),
    ({"capacities_blocks": 100}, "capacities_blocks must be an iterable of integers >= 0 or None, got 100"),
    ({"capacities_blocks": "10"}, "capacities_blocks must be an iterable"),
    ({"touch_order": "random"}, "touch_order must be one of ('head_most_recent', 'tail_most_recent'), got 'random'"),
    ({"warmup_fraction": 1.0}, "warmup_fraction must be a number in [0, 1), got 1.0"),
    ({"warmup_fraction": -0.1}, "warmup_fraction must be a finite number >= 0.0, got -0.1"),
    ({"warmup_fraction": "0.5"}, "warmup_fraction must be a finite number >= 0.0, got '0.5'"),
    ({"shards_rate": 0.0}, "shards_rate must be a finite number in (0.0, 1.0], got 0.0"),
    ({"shards_rate": 1.5}, "shards_rate must be a finite number in (0.0, 1.0], got 1.5"),
    ({"shards_rate": 1e-9}, "shards_rate must be None or a number in (0, 1] that samples at least 1 in 2**24 keys "
                            "(>= 2**-24), got 1e-09"),
    ({"shards_rate": True}, "shards_rate must be a finite number in (0.0, 1.0], got True"),
    ({"seed": -1}, "seed must be an integer in [0, 2**64), got -1"),
    ({"seed": 2**64}, "seed must be an integer in [0, 2**64)"),
    ({"seed": 1.0}, "seed must be an integer in [0, 2**64), got 1.0"),
])
def test_invalid_arguments_name_the_parameter(kwargs, message) -> None:
    with pytest.raises(ValueError) as info:
        mrc(make_trace(SCENARIO), **kwargs)
    assert message in str(info.value)


def test_trace_must_be_a_trace() -> None:
    with pytest.raises(ValueError, match="trace must be a kvlab Trace"):
        mrc("conversation")


# ---------------------------------------------------------------------------------- SHARDS


def test_splitmix64_reference_values() -> None:
    """Vigna's splitmix64.c from state 0: 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, ..."""
    states = np.array([0, 0x9E3779B97F4A7C15], dtype=np.uint64)  # the generator's first two states
    assert [hex(int(h)) for h in splitmix64(states)] == ["0xe220a8397b1dcdaf", "0x6e789e6aa1b965f4"]


def test_shards_sample_is_a_fixed_fraction_of_keys_chosen_by_seed() -> None:
    keys = np.arange(1_000_000, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    threshold = round(0.1 * SHARDS_MODULUS)
    keep = shards_keep(keys, threshold, 0)
    assert abs(keep.mean() - 0.1) < 0.002
    assert np.array_equal(keep, shards_keep(keys, threshold, 0))
    assert np.array_equal(keep[::-1], shards_keep(keys[::-1], threshold, 0))  # a function of the key alone
    assert (keep != shards_keep(keys, threshold, 1)).mean() > 0.1
    assert shards_keep(keys, SHARDS_MODULUS, 7).all()


def test_shards_rate_one_is_the_exact_curve(conversation) -> None:
    caps = SPEC_CAPACITIES
    exact = mrc(conversation, capacities_blocks=caps, touch_order="tail_most_recent")
    full = mrc(conversation, capacities_blocks=caps, touch_order="tail_most_recent", shards_rate=1.0)
    assert full["hit_blocks"].to_list() == exact["hit_blocks"].to_list()
    assert full["block_hit_ratio"].to_list() == exact["block_hit_ratio"].to_list()
    assert full["token_hit_ratio"].to_numpy() == pytest.approx(exact["token_hit_ratio"].to_numpy(), rel=1e-12)
    assert full["evictions"].null_count() == len(caps)


@given(trace=chained_traces(), touch=TOUCH, warmup=st.floats(0.0, 0.9),
       rate=st.sampled_from([0.25, 0.5, 0.75]), seed=st.integers(0, 3))
def test_shards_is_the_exact_curve_of_the_sampled_trace_scaled(trace, touch, warmup, rate, seed) -> None:
    """SHARDS = the exact curve of the trace cut down to its sampled keys (the running
    maximum over a request's sampled blocks only), read at ``floor(C · T / P)``."""
    threshold = round(rate * SHARDS_MODULUS)
    lists = trace.frame["block_keys"].to_list()
    kept = [[k for k in keys if shards_keep(np.array([k], dtype=np.uint64), threshold, seed)[0]] for keys in lists]
    sub = make_trace(kept, block_size=trace.block_size)
    num_keys = trace.distinct_blocks
    caps = list(range(num_keys + 2))
    got = mrc(trace, capacities_blocks=caps, touch_order=touch, warmup_fraction=warmup, shards_rate=rate, seed=seed)
    idx = [num_keys if c >= num_keys else c * threshold // SHARDS_MODULUS for c in caps]
    ref = mrc(sub, capacities_blocks=idx, touch_order=touch, warmup_fraction=warmup)
    expected = ref["block_hit_ratio"].to_list()  # hits / sampled refs (0.0 if none sampled)
    assert got["block_hit_ratio"].to_list() == expected
    exact = mrc(trace, capacities_blocks=caps, warmup_fraction=warmup)
    assert got["block_refs"].to_list() == exact["block_refs"].to_list()


# mean / max absolute error of block_hit_ratio against the exact curve on the default grid,
# seed 0, head most recent (measured: see kvlab.sim.mrc's docstring); bounds ~2x measured
SHARDS_BOUNDS = {
    ("conversation", 0.1): (0.075, 0.085),   # measured 0.0373 / 0.0417
    ("conversation", 0.01): (0.075, 0.085),  # measured 0.0375 / 0.0425
    ("synthetic", 0.1): (0.005, 0.02),       # measured 0.0021 / 0.0090
    ("synthetic", 0.01): (0.01, 0.03),       # measured 0.0044 / 0.0140
}


@pytest.mark.parametrize(("name", "rate"), list(SHARDS_BOUNDS))
def test_shards_error_on_bundled_traces(request, name, rate) -> None:
    trace = request.getfixturevalue(name)
    exact = mrc(trace)
    approx = mrc(trace, shards_rate=rate, seed=0)
    assert approx["capacity_blocks"].to_list() == exact["capacity_blocks"].to_list()
    error = np.abs(approx["block_hit_ratio"].to_numpy() - exact["block_hit_ratio"].to_numpy())
    token_error = np.abs(approx["token_hit_ratio"].to_numpy() - exact["token_hit_ratio"].to_numpy())
    mean_bound, max_bound = SHARDS_BOUNDS[name, rate]
    assert error.mean() < mean_bound and error.max() < max_bound
    assert token_error.mean() < mean_bound and token_error.max() < max_bound
    assert approx["hit_blocks"].to_list() == np.rint(
        approx["block_hit_ratio"].to_numpy() * approx["block_refs"].to_numpy()).astype(int).tolist()


def test_shards_heavy_hitter_explains_the_conversation_error(conversation) -> None:
    """The conversation trace's shared first block (in every request) is not sampled at
    seed 0, rate 0.1: the unbounded estimate is then the hit ratio without that key."""
    flat = conversation.flat
    counts = np.bincount(flat.block_ids)
    hot = int(counts.argmax())
    assert counts[hot] == len(conversation)
    assert not shards_keep(flat.keys[hot:hot + 1], round(0.1 * SHARDS_MODULUS), 0)[0]
    exact = mrc(conversation, capacities_blocks=[None]).row(0, named=True)
    without_hot = (exact["hit_blocks"] - (counts[hot] - 1)) / (exact["block_refs"] - counts[hot])
    estimate = mrc(conversation, capacities_blocks=[None], shards_rate=0.1)["block_hit_ratio"][0]
    assert abs(estimate - without_hot) < 0.01 < abs(estimate - exact["block_hit_ratio"])


def test_shards_small_trace_with_nothing_sampled() -> None:
    trace = make_trace(SCENARIO, block_size=1)
    curve = mrc(trace, capacities_blocks=[0, 3, None], shards_rate=2**-24, seed=0)
    assert curve["block_hit_ratio"].to_list() == [0.0, 0.0, 0.0]
    assert curve["block_refs"].to_list() == [11, 11, 11]
