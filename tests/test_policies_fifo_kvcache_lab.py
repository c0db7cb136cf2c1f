"""kvlab's FIFO against the Mooncake team's own simulator (kvcache-ai/kvcache-blog,
``assets/js/kv-cache-lab.js``), run on small prefix-chained traces: hit tokens recorded in
``tests/vectors/kvcache_lab_hit_tokens.json`` (upstream commit and blob in the file).

Their simulator inserts a request's missing blocks head first, so the head is evicted first:
kvlab's ``touch_order="tail_most_recent"``. kvlab's default (``"head_most_recent"``, vLLM's
reverse free) evicts the tail first and differs (docs/README.md, "Cross-check with the
Mooncake team's simulator")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import make_trace
from kvlab.policies import fifo
from kvlab.sim import replay

VECTORS = json.loads((Path(__file__).parent / "vectors" / "kvcache_lab_hit_tokens.json").read_text())
TRACES = [make_trace(t["block_keys"], block_size=VECTORS["block_size"], input_tokens=t["input_tokens"])
          for t in VECTORS["traces"]]
FILLED = [c for c in VECTORS["cases"] if c["measurement_mode"] == "fixed_window"]


def ours(case: dict, touch_order: str, policy: str | None = None) -> int:
    return replay(TRACES[case["trace"]], capacity_blocks=case["capacity_blocks"], policy=policy or case["policy"],
                  warmup_fraction=case["warmup_fraction"], touch_order=touch_order).summary.hit_tokens


def test_the_vectors_are_upstream_runs() -> None:
    assert VECTORS["verification"] == "upstream_executed"
    assert VECTORS["upstream"]["commit"] == "975328816be5780cfb90c85ee4f03773a11ecc7f"
    assert len(TRACES) == 13 and len([c for c in FILLED if c["policy"] == "fifo"]) == 73


def test_smallest_case_both_ways() -> None:
    """Requests [0, 1, 2], [3], [0, 1, 2], 3 blocks, the last one measured. Head first in
    (theirs, tail_most_recent): block 3 evicts 0, so the third request misses at its head and
    1, 2 cannot count. Tail first in (kvlab's default): 3 evicts 2, and 0, 1 hit."""
    (case,) = [c for c in VECTORS["cases"] if c["trace"] == 0 and c["policy"] == "fifo"]
    assert case["hit_tokens"] == 0 and ours(case, "tail_most_recent") == 0
    assert ours(case, "head_most_recent") == 8


@pytest.mark.parametrize("case", [c for c in FILLED if c["policy"] == "fifo"],
                         ids=lambda c: f"trace{c['trace']}-cap{c['capacity_blocks']}")
def test_fifo_tail_most_recent_is_their_fifo(case: dict) -> None:
    assert ours(case, "tail_most_recent") == case["hit_tokens"]


def test_fifo_head_most_recent_differs() -> None:
    cases = [c for c in FILLED if c["policy"] == "fifo"]
    differ = [c for c in cases if ours(c, "head_most_recent") != c["hit_tokens"]]
    assert len(differ) == 64  # of 73; equal where the order never decided an eviction that mattered


def test_their_underfilled_window_reports_zero() -> None:
    """Their simulator reports 0 when the cache never filled during the warm-up; kvlab counts."""
    (case,) = [c for c in VECTORS["cases"] if c["measurement_mode"] == "underfilled_at_window"
               and c["policy"] == "fifo"]
    assert case["hit_tokens"] == 0 and ours(case, "tail_most_recent") > 0


def test_their_lru_is_not_kvlabs_lru() -> None:
    """Their LRU evicts leaves of a prefix tree, touches only a request's hit prefix and
    protects the request's path: not kvlab's ``lru`` in either order (nor ``leaf_first_lru``)."""
    cases = [c for c in FILLED if c["policy"] == "lru"]
    for touch_order in ("head_most_recent", "tail_most_recent"):
        assert any(ours(c, touch_order) != c["hit_tokens"] for c in cases)
        assert any(ours(c, touch_order, "leaf_first_lru") != c["hit_tokens"] for c in cases)


def test_fifo_docstring_names_the_matching_touch_order() -> None:
    assert 'touch_order="tail_most_recent"' in fifo.__doc__ and "kvcache-blog" in fifo.__doc__
