"""The one-pass totals and columns of a replay (kvlab.sim.replay_pass) against numpy on the same arrays."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.sim.replay_pass import (
    ADMITTED,
    CUT_BLOCKS,
    CUT_EVICTIONS,
    CUT_HITS,
    EVICTIONS,
    HIT_TOKENS,
    HITS,
    INPUT_TOKENS,
    NONEMPTY,
    PEAK_USED,
    REFS,
    RequestColumns,
    request_pass,
)


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6), st.integers(0, 5), st.integers(0, 9),
                               st.booleans()), min_size=0, max_size=40),
       block_size=st.integers(1, 5), skip_share=st.floats(0, 1), picks=st.lists(st.integers(0, 10**6), max_size=8))
def test_pass_is_numpy_on_the_same_arrays(rows, block_size, skip_share, picks) -> None:
    n = len(rows)
    blocks = np.array([r[0] for r in rows], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(blocks)]).astype(np.int64)
    hits = np.array([min(r[1], r[0]) for r in rows], dtype=np.int32)
    tokens = np.array([max(b * block_size - r[2], 0) for b, r in zip(blocks, rows)], dtype=np.uint32)
    evictions = np.array([r[2] for r in rows], dtype=np.int32)
    used = np.array([r[3] for r in rows], dtype=np.int32)
    admitted = np.array([r[4] for r in rows], dtype=np.bool_)
    skip = int(skip_share * n)
    cuts = np.array(sorted(p % (n + 1) for p in picks), dtype=np.int64)
    columns = RequestColumns.empty(n)
    t = request_pass(offsets, tokens, block_size, skip, hits, evictions, used, admitted, cuts=cuts, columns=columns)

    hit_tokens = np.minimum(hits.astype(np.int64) * block_size, tokens)
    m = slice(skip, n)
    nonempty = blocks[m] > 0
    assert t.counts[[HITS, HIT_TOKENS, NONEMPTY, INPUT_TOKENS, EVICTIONS, ADMITTED, REFS]].tolist() == [
        hits[m].sum(), hit_tokens[m].sum(), nonempty.sum(), tokens[m].sum(), evictions[m].sum(), admitted[m].sum(),
        blocks[m].sum()]
    assert t.counts[PEAK_USED] == (used.max() if n else 0)
    assert t.ratio_sum == pytest.approx((hits[m][nonempty] / blocks[m][nonempty]).sum())
    for col, values in ((CUT_HITS, hits), (CUT_BLOCKS, blocks), (CUT_EVICTIONS, evictions)):
        running = np.concatenate([[0], np.cumsum(values, dtype=np.int64)])
        assert t.cut_sums[:, col].tolist() == running[cuts].tolist()
    assert columns.blocks.tolist() == blocks.tolist()
    assert columns.hit_tokens.tolist() == hit_tokens.tolist()
    assert columns.miss_blocks.tolist() == (blocks - hits).tolist()
    assert columns.miss_tokens.tolist() == (tokens - hit_tokens).tolist()
    assert columns.rejected.tolist() == (~admitted).tolist()
    assert columns.measured.tolist() == [r >= skip for r in range(n)]


def test_pass_rejects_bad_arguments() -> None:
    one = np.zeros(1, dtype=np.int32)
    args = (np.array([0, 1]), np.array([4], np.uint32), 4)
    with pytest.raises(ValueError, match="skip must be in \\[0, 1\\], got 2"):
        request_pass(*args, 2, one, one, one, np.ones(1, np.bool_))
    with pytest.raises(ValueError, match="per-request arrays must have 1 values"):
        request_pass(*args, 0, np.zeros(2, np.int32), one, one, np.ones(1, np.bool_))
    with pytest.raises(ValueError, match="cuts must be non-decreasing positions in \\[0, 1\\]"):
        request_pass(*args, 0, one, one, one, np.ones(1, np.bool_), cuts=np.array([1, 0]))
    with pytest.raises(ValueError, match="columns must have 1 values each"):
        request_pass(*args, 0, one, one, one, np.ones(1, np.bool_), columns=RequestColumns.empty(3))
