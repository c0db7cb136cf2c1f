"""Cache-level replay in vLLM-faithful mode (vLLM v1's block pool, one request at a time)."""

from __future__ import annotations

import polars as pl
import pytest

from conftest import make_trace
from kvlab.sim import ReplayConfig, replay, sweep
from kvlab.traces import Trace


def test_reverse_free_keeps_chains_whole() -> None:
    """engines.md §1.3 scenario 2 (llm-d-inference-sim issue #704): a 3-block pool holds a
    finished [a, b, c]; the next request needs one block: vLLM evicts c, so a repeat of the
    prefix still hits 2 blocks."""
    trace = make_trace([[1, 2, 3], [9], [1, 2, 3]], block_size=4, input_tokens=[12, 4, 12])
    for order in ("classic", "current"):
        req = replay(trace, capacity_blocks=3, mode="vllm", free_order=order).requests
        assert req["hit_blocks"].to_list() == [0, 0, 2]
        assert req["evictions"].to_list() == [0, 1, 1]


def test_last_token_rule_and_full_blocks_only() -> None:
    """§1.3 scenario 3: a fully cached 32-token prompt at B=16 reuses 16 tokens; 33 → 32."""
    trace = make_trace([[1, 2], [1, 2], [1, 2, 3]], block_size=16, input_tokens=[32, 32, 33])
    req = replay(trace, mode="vllm").requests
    assert req["hit_tokens"].to_list() == [0, 16, 32]
    # a keyed partial tail (Mooncake ids) is never cached: the repeat hits only the full block
    tail = make_trace([[5, 6], [5, 6]], block_size=16, input_tokens=[20, 20])
    assert replay(tail, mode="vllm").requests["hit_blocks"].to_list() == [0, 1]
    assert replay(tail).requests["hit_blocks"].to_list() == [0, 2]  # prefix mode keys the tail


def test_requests_larger_than_the_pool_are_rejected() -> None:
    trace = make_trace([[1, 2, 3], [1, 2, 3, 4, 5], [1, 2, 3]], block_size=1)
    result = replay(trace, capacity_blocks=4, mode="vllm")
    assert result.requests["rejected"].to_list() == [False, True, False]
    assert result.requests["hit_blocks"].to_list() == [0, 0, 2]
    assert result.summary.rejected_requests == 1 and result.summary.config.mode == "vllm"


def test_design_doc_example_in_both_free_orders() -> None:
    """engines.md §1.3 scenario 1 (vLLM docs/design/prefix_caching.md), B=4, 10 blocks:
    request 0 fills blocks 0-4 (4 partial), request 1 hits 0, 1 and adds 5 (full) and 6
    (partial), request 2 (29 tokens, first 12 shared) hits 0, 1, 2 and needs 5 more. Classic
    order hands it 7 8 9 4 3, evicting cached block 3; current order hands it 6 4 7 8 9 and
    evicts nothing."""
    a0, a1, a2, a3, b2, c3, c4, c5, c6 = range(9)
    keys = [[a0, a1, a2, a3], [a0, a1, b2], [a0, a1, a2, c3, c4, c5, c6]]
    frame = make_trace(keys, block_size=4).frame.with_columns(input_tokens=pl.Series([18, 14, 29], dtype=pl.UInt32))
    trace = Trace(frame, block_size=4, partial_block_keyed=False)
    classic = replay(trace, capacity_blocks=10, mode="vllm", free_order="classic").requests
    current = replay(trace, capacity_blocks=10, mode="vllm", free_order="current").requests
    assert classic["hit_blocks"].to_list() == current["hit_blocks"].to_list() == [0, 2, 3]
    assert classic["evictions"].to_list() == [0, 0, 1]
    assert current["evictions"].to_list() == [0, 0, 0]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"mode": "sglang"}, "mode must be one of"),
    ({"free_order": "fifo"}, "free_order must be one of"),
    ({"mode": "vllm", "touch_order": "tail_most_recent"}, "mode 'vllm' replays vLLM's free queue"),
])
def test_config_errors(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        ReplayConfig(**kwargs)


def test_vllm_mode_on_the_conversation_trace(conversation) -> None:
    """Full blocks and the last-token rule lower the ceiling below the prefix-mode 0.3664."""
    s = replay(conversation, mode="vllm").summary
    assert s.block_hit_ratio < replay(conversation).summary.block_hit_ratio
    assert s.rejected_requests == 0 and s.evictions == 0


def test_rejections_appear_beside_the_hit_ratios() -> None:
    """Issue 14 item 11: a pool smaller than a request never admits it; the summary's text and the
    sweep rows say so (request 1 needs 5 blocks of a 4-block pool)."""
    trace = make_trace([[1, 2, 3], [1, 2, 3, 4, 5], [1, 2, 3]], block_size=1)
    text = str(replay(trace, capacity_blocks=4, mode="vllm").summary).splitlines()
    assert text[-1] == "rejected     1 of 3 requests never admitted (more blocks than the pool; counted as misses)"
    assert text[3] == "block hits   2 / 11 = 0.1818"  # request 2 hits 1, 2 (its last token recomputed)
    assert not any(line.startswith("rejected") for line in str(replay(trace, capacity_blocks=4).summary).splitlines())
    frame = sweep(trace, [4, 5], mode="vllm", executor="serial")
    assert frame["rejected_requests"].to_list() == [1, 0]
    assert sweep(trace, [4]).columns[:5] == ["policy", "capacity_blocks", "block_hit_ratio", "token_hit_ratio",
                                            "rejected_requests"]
    assert sweep(trace, [4]).columns[-1] == "source"  # the long path last: a printed frame shows the results


def test_synthetic_trace_in_a_20_block_pool_reports_its_rejections(synthetic) -> None:
    """The case of issue 14 item 11: 2,066 of the 3,993 synthetic requests need more than 20 blocks."""
    needs = -(-synthetic.frame["input_tokens"].cast(pl.Int64) // synthetic.block_size)
    assert int((needs > 20).sum()) == 2_066  # vLLM allocates every block of the prompt, the partial one too
    summary = replay(synthetic, capacity_blocks=20, mode="vllm").summary
    assert summary.rejected_requests == 2_066
    assert "rejected     2,066 of 3,993 requests never admitted" in str(summary)


@pytest.mark.parametrize("free_order", ["classic", "current"])
def test_free_order_is_refused_outside_the_vllm_modes(free_order: str) -> None:
    """Issue 14 item 14: the prefix mode has no free queue; a free order there was silently ignored."""
    trace = make_trace([[1, 2]])
    with pytest.raises(ValueError, match=f"free_order applies to modes 'vllm' and 'omlx' .* got free_order="
                                         f"'{free_order}'"):
        replay(trace, free_order=free_order)
    with pytest.raises(ValueError, match="free_order applies to modes 'vllm' and 'omlx'"):
        sweep(trace, [1], free_order=free_order)
    assert ReplayConfig().free_order is None and ReplayConfig(mode="vllm").free_order == "current"
    assert ReplayConfig(mode="vllm", free_order=free_order).free_order == free_order
