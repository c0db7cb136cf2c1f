"""Hit ratios on the real Mooncake traces, against values computed independently.

Issue #2's table and docs/specs/traces.md §5 (an independent standard-library
implementation, cross-checked with llmtrafficlens to the printed digit). Tolerance 5e-5.
"""

from __future__ import annotations

import pytest

from kvlab.sim import replay

TOL = 5e-5

# (trace, capacity, touch order, block hit ratio, token hit ratio) — issue #2
ISSUE_TABLE = [
    ("conversation", None, "head_most_recent", 0.3664, 0.3736),
    ("conversation", 10_000, "head_most_recent", 0.2116, 0.2157),
    ("conversation", 10_000, "tail_most_recent", 0.2112, 0.2153),
    ("synthetic", None, "head_most_recent", 0.6396, 0.6512),
    ("synthetic", 10_000, "head_most_recent", 0.4239, 0.4318),
    ("synthetic", 10_000, "tail_most_recent", 0.4235, 0.4313),
]

# traces.md §5.1: forward touch order (= tail_most_recent), whole trace
SPEC_5_1 = [
    ("conversation", 1_000, 0.0445, 0.0454), ("conversation", 5_000, 0.1104, 0.1125),
    ("conversation", 5_859, 0.1355, 0.1382), ("conversation", 30_000, 0.3257, 0.3321),
    ("conversation", 50_000, 0.3546, 0.3615), ("conversation", 97_656, 0.3635, 0.3707),
    ("conversation", 100_000, 0.3637, 0.3708),
    ("synthetic", 1_000, 0.0825, 0.0840), ("synthetic", 5_000, 0.2791, 0.2843),
    ("synthetic", 5_859, 0.3094, 0.3151), ("synthetic", 30_000, 0.6242, 0.6356),
    ("synthetic", 50_000, 0.6396, 0.6512),
]

# traces.md §5.3: last 50 % of requests measured (warm-up 0.5), forward touch order
SPEC_5_3 = [
    ("conversation", None, 0.3900, 0.3981), ("conversation", 1_000, 0.0458, 0.0467),
    ("conversation", 5_000, 0.1103, 0.1125), ("conversation", 10_000, 0.2144, 0.2188),
    ("conversation", 30_000, 0.3368, 0.3438), ("conversation", 50_000, 0.3690, 0.3767),
    ("conversation", 100_000, 0.3842, 0.3922),
    ("synthetic", None, 0.8511, 0.8627), ("synthetic", 1_000, 0.1261, 0.1280),
    ("synthetic", 5_000, 0.4109, 0.4168), ("synthetic", 10_000, 0.5952, 0.6036),
    ("synthetic", 30_000, 0.8264, 0.8378), ("synthetic", 100_000, 0.8511, 0.8627),
]


@pytest.mark.parametrize(("name", "capacity", "touch", "block", "token"), ISSUE_TABLE)
def test_issue_table(name, capacity, touch, block, token, request) -> None:
    s = replay(request.getfixturevalue(name), capacity_blocks=capacity, touch_order=touch).summary
    assert s.block_hit_ratio == pytest.approx(block, abs=TOL)
    assert s.token_hit_ratio == pytest.approx(token, abs=TOL)


@pytest.mark.parametrize(("name", "capacity", "block", "token"), SPEC_5_1)
def test_spec_whole_trace(name, capacity, block, token, request) -> None:
    s = replay(request.getfixturevalue(name), capacity_blocks=capacity, touch_order="tail_most_recent").summary
    assert s.block_hit_ratio == pytest.approx(block, abs=TOL)
    assert s.token_hit_ratio == pytest.approx(token, abs=TOL)


@pytest.mark.parametrize(("name", "capacity", "block", "token"), SPEC_5_3)
def test_spec_last_half(name, capacity, block, token, request) -> None:
    s = replay(request.getfixturevalue(name), capacity_blocks=capacity, touch_order="tail_most_recent",
               warmup_fraction=0.5).summary
    assert s.block_hit_ratio == pytest.approx(block, abs=TOL)
    assert s.token_hit_ratio == pytest.approx(token, abs=TOL)


@pytest.mark.parametrize(("name", "mean_ratio"), [("conversation", 0.3843), ("synthetic", 0.4232)])
def test_mean_per_request_block_ratio(name, mean_ratio, request) -> None:
    """traces.md §5.1 'mean per-request block ratio' (infinite cache)."""
    s = replay(request.getfixturevalue(name)).summary
    assert s.mean_request_block_hit_ratio == pytest.approx(mean_ratio, abs=TOL)


# traces.md §5.2: capacities on the FAST'25 Figure 9 axis (token hit, forward touch order);
# the conversation column matches llmtrafficlens's printed values (§4.5) to 0.1 %.
SPEC_5_2 = [
    (20, 0.0265, 0.0005), (32, 0.0329, 0.0011), (128, 0.0418, 0.0070), (195, 0.0425, 0.0116),
    (512, 0.0430, 0.0437), (1_953, 0.0542, 0.1421), (2_048, 0.0560, 0.1488), (8_192, 0.1847, 0.3849),
    (19_531, 0.2908, 0.5768), (32_768, 0.3415, 0.6406), (195_312, 0.3736, 0.6512),
]


@pytest.mark.parametrize(("capacity", "conversation_token", "synthetic_token"), SPEC_5_2)
def test_spec_figure9_axis(capacity, conversation_token, synthetic_token, conversation, synthetic) -> None:
    for trace, expected in ((conversation, conversation_token), (synthetic, synthetic_token)):
        s = replay(trace, capacity_blocks=capacity, touch_order="tail_most_recent").summary
        assert s.token_hit_ratio == pytest.approx(expected, abs=TOL)


def test_synthetic_fits_entirely_at_its_working_set(synthetic) -> None:
    s = replay(synthetic, capacity_blocks=43_924).summary
    assert s.evictions == 0 and s.peak_used_blocks == 43_924
    assert s.block_hit_ratio == replay(synthetic).summary.block_hit_ratio
