"""Prefix-cache statistics of a vLLM v1 KV cache manager.

Models ``vllm/v1/metrics/stats.py :: PrefixCacheStats`` (rule V11, docs/specs/engines.md
§1.2): counters kept apart from the cache state, recorded once per admitted request and
handed out take-and-reset by :meth:`KVCacheManager.make_prefix_cache_stats
<kvlab.engines.vllm.kv_cache_manager.KVCacheManager.make_prefix_cache_stats>`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.core.validate import check_count


@dataclass
class PrefixCacheStats:
    """Token-level prefix-cache counters since the last take.

    Models vLLM v1 ``PrefixCacheStats``. Requests that were preempted before go to the
    ``preempted_*`` counters, which the headline :attr:`hit_rate` leaves out: a resumed
    request mostly hits its own blocks, and counting those would flatter the cache.

    Example:
        >>> stats = PrefixCacheStats()
        >>> stats.record(num_tokens=20, num_hits=16)
        >>> stats.record(num_tokens=20, num_hits=16, preempted=True)
        >>> stats.requests, stats.queries, stats.hits, stats.preempted_hits, stats.hit_rate
        (1, 20, 16, 16, 0.8)
    """

    reset: bool = False
    """Set when the prefix cache was reset since the last take (rule V12)."""
    requests: int = 0
    """Admitted requests not preempted before."""
    queries: int = 0
    """Their prompt lengths in tokens (the full ``num_tokens``, not ``num_tokens - 1``)."""
    hits: int = 0
    """Their prefix-hit tokens."""
    preempted_requests: int = 0
    """Re-admitted requests that were preempted before (rule V14)."""
    preempted_queries: int = 0
    """Their lengths in tokens."""
    preempted_hits: int = 0
    """Their prefix-hit tokens."""

    def record(self, num_tokens: int, num_hits: int, preempted: bool = False) -> None:
        """Count one admission: ``num_tokens`` queried, ``num_hits`` of them hit.

        Models vLLM v1 ``PrefixCacheStats.record`` (rule V11).

        Raises:
            ValueError: a count that is not an integer >= 0, or ``num_hits > num_tokens``.
        """
        num_tokens, num_hits = check_count("num_tokens", num_tokens), check_count("num_hits", num_hits)
        if num_hits > num_tokens:
            raise ValueError(f"num_hits must be <= num_tokens ({num_tokens}), got {num_hits}")
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits

    @property
    def hit_rate(self) -> float:
        """``hits / queries`` over requests not preempted before; 0.0 when none."""
        return self.hits / self.queries if self.queries else 0.0
