"""CacheBlend on a simulated worker: stored chunks found past the prefix hit are blended, not prefilled.

A worker with ``ClusterConfig.blend`` keeps LMCache's chunk store of the prompts it served
(:class:`~kvlab.blend.TokenRangeMatcher`, 256-token chunks, rules B9–B15). At a request's
admission, after its prefix hit, the stored chunks found anywhere else in its prompt are split
by :func:`~kvlab.blend.prefill_savings` (B2, B4, B16, B17) into blended tokens — their KV reused,
``recompute_ratio`` of them recomputed (CacheBlend's selective recompute) — and fresh ones. The
prefill chunks the scheduler runs keep their token counts (the engine holds KV for every prompt
token), but the time model is charged only the tokens a chunk really computes: its fresh tokens
and its share of the recomputed ones. The reused KV is loaded while the selected tokens are
recomputed (CacheBlend pipelines the two, §5 of the paper), so the load is not on the critical
path here; a load slower than the recompute would be. Prompts need token ids (a trace with a
``token_ids`` column, e.g. :func:`kvlab.traces.rag`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvlab.blend.matcher import TokenRangeMatcher
from kvlab.blend.savings import DEFAULT_MIN_BLEND_TOKENS, DEFAULT_RECOMPUTE_RATIO, PrefillSavings, prefill_savings
from kvlab.core.validate import check_count, check_positive, check_real


@dataclass(frozen=True)
class BlendSpec:
    """CacheBlend on every worker (see the module docstring).

    Args:
        chunk_size: tokens per stored chunk (LMCache's 256).
        recompute_ratio: share of blended tokens recomputed, in ``[0, 1]`` (CacheBlend: 0.15).
        min_blend_tokens: blend only when at least this many non-prefix tokens are reusable.

    >>> BlendSpec().chunk_size, BlendSpec(recompute_ratio=0.2).recompute_ratio
    (256, 0.2)
    """

    chunk_size: int = 256
    recompute_ratio: float = DEFAULT_RECOMPUTE_RATIO
    min_blend_tokens: int = DEFAULT_MIN_BLEND_TOKENS

    def __post_init__(self) -> None:
        object.__setattr__(self, "chunk_size", check_positive("blend chunk_size", self.chunk_size))
        object.__setattr__(self, "recompute_ratio",
                           check_real("blend recompute_ratio", self.recompute_ratio, low=0.0, high=1.0))
        object.__setattr__(self, "min_blend_tokens", check_count("blend min_blend_tokens", self.min_blend_tokens))


class WorkerBlend:
    """One worker's chunk store and the per-request split of its prefill.

    >>> wb = WorkerBlend(BlendSpec(chunk_size=4, min_blend_tokens=4))
    >>> wb.store(np.arange(8, dtype=np.uint32), request_index=0)
    >>> s = wb.split(np.array([9, 9, 9, 9, 4, 5, 6, 7], dtype=np.uint32), prefix_hit_tokens=0)
    >>> s.blended_tokens, s.recomputed_blend_tokens, s.fresh_tokens
    (4, 1, 4)
    """

    def __init__(self, spec: BlendSpec) -> None:
        self.spec = spec
        self.matcher = TokenRangeMatcher(spec.chunk_size)

    def split(self, tokens: np.ndarray, prefix_hit_tokens: int) -> PrefillSavings:
        """The prompt's prefix hit / blended / fresh split against the chunks stored so far."""
        matches = self.matcher.match(tokens)
        return prefill_savings(int(tokens.shape[0]), prefix_hit_tokens, matches,
                               recompute_ratio=self.spec.recompute_ratio, min_blend_tokens=self.spec.min_blend_tokens,
                               chunk_size=self.spec.chunk_size)

    def store(self, tokens: np.ndarray, request_index: int) -> None:
        """Store a served prompt's full chunks (keys unique to the request and chunk position)."""
        num_chunks = tokens.shape[0] // self.spec.chunk_size
        keys = (np.uint64(request_index) << np.uint64(24)) + np.arange(1, num_chunks + 1, dtype=np.uint64)
        self.matcher.register(tokens[: num_chunks * self.spec.chunk_size], keys)


def computed_in_chunk(savings: PrefillSavings, start: int, num_tokens: int, ratio: float) -> int:
    """Tokens of prompt positions ``[start, start + num_tokens)`` the GPU computes: the fresh ones
    plus the chunk's share of the recomputed blended ones (cumulative half-up rounding, so the
    chunks of one prompt add up to ``savings.computed_tokens``).

    >>> s = PrefillSavings(1024, 0, 512, 77, 512, ((256, 768),))
    >>> computed_in_chunk(s, 0, 512, 0.15) + computed_in_chunk(s, 512, 512, 0.15) == s.computed_tokens
    True
    """
    def blended_before(x: int) -> int:
        return sum(max(0, min(ed, x) - st) for st, ed in savings.blend_ranges)

    def recomputed_before(x: int) -> int:
        return int(np.floor(ratio * blended_before(x) + 0.5))

    end = start + num_tokens
    blended = blended_before(end) - blended_before(start)
    return num_tokens - blended + recomputed_before(end) - recomputed_before(start)
