"""CacheBlend-style non-prefix chunk matching: stored chunks found anywhere in a query.

Models LMCache's blend matcher and lookup helpers and the CacheBlend paper's reuse of
non-prefix chunks (docs/specs/index_blend.md Part D, rules B1-B21); the upstream limits of
B21 are fixed (see :mod:`kvlab.blend.matcher` and :mod:`kvlab.blend.table`).

================================  ===============================  ==========================================
piece                             models                           in → out
================================  ===============================  ==========================================
:func:`rolling_hashes`            LMCache token_hasher (B5)        tokens → uint64 fingerprint per window
:func:`chunk_hashes`              LMCache token_hasher (B6)        tokens → uint64 fingerprint per chunk
:func:`write_table`               direct-address table (B7)        fingerprints → ids, last write wins
:func:`unique_hits`               older matcher probe (B8)         fingerprints → ids, first encounter
:class:`TokenRangeMatcher`        BlendTokenRangeMatcher (B9-B15)  chunks registered; query → BlendMatch list
:func:`unique_token_coverage`     lookup statistics (B16)          matches → covered query tokens
:func:`leftmost_non_overlapping`  lookup dedup (B17)               matches → loadable ones after the prefix
:func:`group_consecutive`         older lookup (B18)               matches → back-to-back runs
:func:`prefix_run_tokens`         prefix path (B19)                matches → tokens of the aligned run from 0
:func:`classify`                  hit classes (B19)                match → prefix / aligned / shifted
:func:`prefill_savings`           LMCache blend lookup (B4, B17)   prefix hit + matches → tokens saved
:func:`ttft_saved_s`              kvlab.tiers cost model           savings, model, GPU, device → seconds
:func:`replay_rag`                prefix-only vs prefix + blend    a RAG trace → per-request savings
:func:`replay_segments`           prefix vs segment reuse          segments (RAGPulse) → prefix / blend hits
================================  ===============================  ==========================================

The RAG workload is :func:`kvlab.traces.rag` (Opal's, O28-O31).
"""

from kvlab.blend.kernels import BLEND_BASE, EMPTY, chunk_hashes, rolling_hashes, unique_hits, write_table
from kvlab.blend.matcher import TABLE_BITS_RANGE, BlendMatch, TokenRangeMatcher
from kvlab.blend.ranges import (
    HIT_CLASSES,
    classify,
    group_consecutive,
    leftmost_non_overlapping,
    prefix_run_tokens,
    unique_token_coverage,
)
from kvlab.blend.replay import RagConfig, RagSummary, replay_rag
from kvlab.blend.savings import (
    DEFAULT_MIN_BLEND_TOKENS,
    DEFAULT_RECOMPUTE_RATIO,
    PrefillSavings,
    prefill_savings,
    ttft_saved_s,
)
from kvlab.blend.segments import SegmentConfig, SegmentSummary, replay_segments

__all__ = [
    # kernels
    "BLEND_BASE",
    "EMPTY",
    "chunk_hashes",
    "rolling_hashes",
    "unique_hits",
    "write_table",
    # matcher
    "TABLE_BITS_RANGE",
    "BlendMatch",
    "TokenRangeMatcher",
    # ranges
    "HIT_CLASSES",
    "classify",
    "group_consecutive",
    "leftmost_non_overlapping",
    "prefix_run_tokens",
    "unique_token_coverage",
    # savings and replay
    "DEFAULT_MIN_BLEND_TOKENS",
    "DEFAULT_RECOMPUTE_RATIO",
    "PrefillSavings",
    "RagConfig",
    "RagSummary",
    "prefill_savings",
    "replay_rag",
    "replay_segments",
    "SegmentConfig",
    "SegmentSummary",
    "ttft_saved_s",
]
