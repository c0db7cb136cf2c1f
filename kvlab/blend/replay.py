"""Replay a trace with token ids through prefix-only caching and through prefix + blend caching."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import polars as pl

from kvlab.blend.matcher import TokenRangeMatcher
from kvlab.blend.ranges import leftmost_non_overlapping
from kvlab.blend.savings import DEFAULT_MIN_BLEND_TOKENS, DEFAULT_RECOMPUTE_RATIO, prefill_savings, ttft_saved_s
from kvlab.core.result import RunResult, RunSummary, timeline_frame
from kvlab.core.semantics import SINGLE_TIER
from kvlab.core.validate import check_count, check_positive, check_real
from kvlab.tiers.devices import Device
from kvlab.tiers.models import ModelSpec
from kvlab.traces.trace import Trace

__all__ = ["RagConfig", "RagSummary", "replay_rag"]

_COUNTS = ("blended_tokens", "recomputed_blend_tokens", "fresh_tokens", "saved_tokens")


class _LruChunks:
    """Chunk keys with LRU order and an optional capacity (in chunks)."""

    def __init__(self, capacity_chunks: int | None) -> None:
        self.capacity_chunks = capacity_chunks
        self.keys: OrderedDict[int, None] = OrderedDict()
        self.evicted_chunks = 0

    def __len__(self) -> int:
        return len(self.keys)

    def prefix_hits(self, chunk_keys: list[int]) -> int:
        """Number of leading chunk keys present (the contiguous prefix hit)."""
        n = 0
        while n < len(chunk_keys) and chunk_keys[n] in self.keys:
            n += 1
        return n

    def touch(self, keys: Iterable[int]) -> None:
        """Insert or refresh ``keys`` as most recently used, in the order given."""
        for key in keys:
            self.keys[key] = None
            self.keys.move_to_end(key)

    def evict_over_capacity(self) -> list[int]:
        """Drop least recently used keys until the capacity holds; return them."""
        if self.capacity_chunks is None:
            return []
        evicted = []
        while len(self.keys) > self.capacity_chunks:
            evicted.append(self.keys.popitem(last=False)[0])
        self.evicted_chunks += len(evicted)
        return evicted


@dataclass(frozen=True)
class RagConfig:
    """What :func:`replay_rag` runs: chunking, cache capacity, the blend rule and the TTFT model.

    Attributes:
        chunk_size: tokens per cached chunk (≥ 1; LMCache's 256).
        capacity_chunks: chunks each cache holds (≥ 1), or ``None`` for unbounded.
        recompute_ratio: share of blended tokens recomputed, in ``[0, 1]``.
        min_blend_tokens: minimum reusable non-prefix tokens to blend (≥ 0).
        model: model shape for the TTFT estimate, or ``None`` for token counts only.
        gpu_flops: dense FLOP/s of the prefill GPUs (> 0; required with ``model``).
        device: tier the reused KV is loaded from (``None`` = already on the GPU); only with ``model``.
        link: link from ``device`` to the GPU, or ``None``; only with ``model``.

    Raises:
        ValueError: a field out of range, ``model`` without ``gpu_flops`` (or the reverse),
            ``device``/``link`` without ``model`` or not a :class:`kvlab.tiers.Device`.

    Example:
        >>> RagConfig(chunk_size=np.int64(512)).chunk_size
        512
        >>> RagConfig(recompute_ratio=2.0)
        Traceback (most recent call last):
        ...
        ValueError: recompute_ratio must be a finite number in [0.0, 1.0], got 2.0
    """

    chunk_size: int = 256
    capacity_chunks: int | None = None
    recompute_ratio: float = DEFAULT_RECOMPUTE_RATIO
    min_blend_tokens: int = DEFAULT_MIN_BLEND_TOKENS
    model: ModelSpec | None = None
    gpu_flops: float | None = None
    device: Device | None = None
    link: Device | None = None

    def __post_init__(self) -> None:
        normal = {
            "chunk_size": check_positive("chunk_size", self.chunk_size),
            "capacity_chunks": check_positive("capacity_chunks", self.capacity_chunks, optional=True),
            "recompute_ratio": check_real("recompute_ratio", self.recompute_ratio, low=0.0, high=1.0),
            "min_blend_tokens": check_count("min_blend_tokens", self.min_blend_tokens),
            "gpu_flops": check_real("gpu_flops", self.gpu_flops, low=0.0, low_open=True, optional=True),
        }
        for name, value in normal.items():
            object.__setattr__(self, name, value)
        if (self.model is None) != (self.gpu_flops is None):
            raise ValueError(f"model and gpu_flops go together, got model={self.model!r}, gpu_flops={self.gpu_flops!r}")
        if self.model is not None and not isinstance(self.model, ModelSpec):
            raise ValueError(f"model must be a kvlab.tiers ModelSpec (e.g. kvlab.tiers.get_model), got {self.model!r}")
        if self.model is None and (self.device is not None or self.link is not None):
            raise ValueError(f"device/link need model and gpu_flops (they only enter the TTFT estimate), got "
                             f"device={self.device!r}, link={self.link!r} with model=None")
        for name, value in (("device", self.device), ("link", self.link)):
            if value is not None and not isinstance(value, Device):
                raise ValueError(f"{name} must be a kvlab.tiers Device (e.g. kvlab.tiers.get_device), got {value!r}")


@dataclass(frozen=True)
class RagSummary(RunSummary):
    """Totals of one :func:`replay_rag` over every request.

    ``input_tokens`` (all prompt tokens), ``hit_blocks`` / ``hit_tokens`` (the prefix + blend
    cache's prefix hits, chunks / tokens), the :class:`~kvlab.blend.savings.PrefillSavings`
    totals of prefix + blend caching, ``prefix_only_saved_tokens`` (prefix-only caching), the
    two saved fractions (of all prompt tokens; 0.0 for an empty prompt total), the LRU
    evictions of each cache, chunks, and the TTFT saved by each, seconds (``None`` without a
    model).

    Example:
        >>> RagSummary.driver
        'replay_rag'
    """

    driver: ClassVar[str] = "replay_rag"
    source: str
    config: RagConfig
    requests: int
    input_tokens: int
    hit_blocks: int
    hit_tokens: int
    blended_tokens: int
    recomputed_blend_tokens: int
    fresh_tokens: int
    saved_tokens: int
    saved_fraction: float
    evicted_chunks: int
    prefix_only_saved_tokens: int
    prefix_only_saved_fraction: float
    prefix_only_evicted_chunks: int
    ttft_saved_s: float | None
    prefix_only_ttft_saved_s: float | None


def replay_rag(trace: Trace, *, chunk_size: int = 256, capacity_chunks: int | None = None,
               recompute_ratio: float = DEFAULT_RECOMPUTE_RATIO, min_blend_tokens: int = DEFAULT_MIN_BLEND_TOKENS,
               model: ModelSpec | None = None, gpu_flops: float | None = None, device: Device | None = None,
               link: Device | None = None) -> RunResult:
    """Replay ``trace`` through prefix-only caching and through prefix + blend caching (CacheBlend).

    Both caches hold ``chunk_size``-token chunks of the prompts, keyed by the trace's chained
    block keys at chunk granularity (chunk ``j``'s key is the key of its last block, as
    :meth:`Trace.rechunk`; equal key ⇔ equal whole prefix), with LRU eviction beyond
    ``capacity_chunks`` (None = unbounded). Each request, in arrival order:

    1. prefix-only: its hit is the run of leading chunks whose keys are cached;
    2. prefix + blend: the same prefix hit in the blend cache, then
       :meth:`TokenRangeMatcher.match` of the whole prompt, de-duplicated after the prefix
       and costed by :func:`~kvlab.blend.savings.prefill_savings` (B12, B16, B17);
       blended chunks count as used (refreshed in the LRU order);
    3. after it is served, every full chunk of the prompt is stored in both caches (refreshed
       tail first, so a prompt's first chunk is the most recent, as vLLM frees a request's
       blocks tail first), registered in the matcher (``storage_keys`` = the chunk keys,
       position offset 0; already registered keys are skipped, B10), and the LRU chunks over
       capacity are evicted — from the blend cache and, via :meth:`TokenRangeMatcher.remove`,
       from the matcher, so an evicted chunk is never blended again.

    With ``capacity_chunks``, the two caches are separate LRUs that drift apart: the blend cache
    also refreshes the chunks it blends, so it evicts other chunks than the prefix-only cache,
    and on a single request blend can save LESS than prefix-only (a prefix chunk the prefix-only
    cache still holds was evicted from the blend cache). Totals over a trace have been observed
    ``>=`` prefix-only in kvlab's tests, but that is not guaranteed. With an unbounded cache
    (``capacity_chunks=None``) both caches hold the same chunks, the prefix hits are equal, and
    blend saves at least as much as prefix-only on every request.

    A whole-prompt hit is counted in full (no last token recomputed for the logits); a trailing
    partial chunk is never cached. Times come from :func:`~kvlab.blend.savings.ttft_saved_s`
    with ``block_size = chunk_size``.

    Args:
        trace: a trace with ``token_ids`` (e.g. :func:`kvlab.traces.rag`).
        chunk_size, capacity_chunks, recompute_ratio, min_blend_tokens, model, gpu_flops, device,
            link: as :class:`RagConfig` (``chunk_size`` a multiple of ``trace.block_size``; counts
            may be ints or numpy integers).

    Returns:
        A :class:`~kvlab.core.RunResult` (a "block" is a chunk here):

        * ``requests``: ``request_id`` (u64), ``arrival_s`` (f64), ``input_tokens`` (the prompt),
          ``hit_blocks`` and ``hit_tokens`` (the prefix + blend cache's prefix hit, chunks and
          tokens), then the rest of prefix + blend's split: ``blended_tokens``,
          ``recomputed_blend_tokens``, ``fresh_tokens``, ``saved_tokens`` (as
          :class:`~kvlab.blend.savings.PrefillSavings`), and prefix-only caching's
          ``prefix_only_saved_tokens`` (its prefix hit; counts i64); with a model also
          ``ttft_saved_s`` and ``prefix_only_ttft_saved_s`` (f64 seconds,
          :func:`~kvlab.blend.savings.ttft_saved_s`);
        * ``timeline``: the blend cache per request (tier ``"cache"``): ``used_blocks``,
          ``capacity_blocks`` (bounded), ``evictions``, ``hit_blocks``, ``miss_blocks`` (the
          prompt's chunks, a partial one included, past the prefix hit);
        * ``summary``: a :class:`RagSummary`; ``config``: the :class:`RagConfig`.

    Raises:
        ValueError: not a :class:`~kvlab.traces.Trace`, a trace without block identity or
            without ``token_ids``, a
            ``chunk_size`` that is not a multiple of the block size, or a bad :class:`RagConfig`
            field.

    Example:
        >>> from kvlab.traces import rag
        >>> trace = rag(4, num_documents=3, document_tokens=512, system_prompt_tokens=256, docs_per_request=2,
        ...             order="shuffled", seed=0)
        >>> trace.frame["document_ids"].to_list()
        [[2, 1], [1, 0], [2, 0], [1, 2]]
        >>> r = replay_rag(trace)          # request 1: system prompt hit, document 1 blended from request 0
        >>> r.requests["prefix_only_saved_tokens"].to_list(), r.requests["blended_tokens"].to_list()
        ([0, 256, 768, 768], [0, 512, 512, 512])
        >>> r.requests["saved_tokens"].to_list(), r.summary.saved_fraction
        ([0, 691, 1203, 1203], 0.6048828125)
    """
    config = RagConfig(chunk_size=chunk_size, capacity_chunks=capacity_chunks, recompute_ratio=recompute_ratio,
                       min_blend_tokens=min_blend_tokens, model=model, gpu_flops=gpu_flops, device=device, link=link)
    _check_trace(trace, config.chunk_size)
    columns, used, evictions, prefix_only_evicted = _run(trace, config)
    num_chunks = -(-pl.Series(columns["input_tokens"]).to_numpy() // config.chunk_size)
    requests = pl.DataFrame({
        "request_id": trace.frame["request_id"], "arrival_s": trace.frame["arrival_s"],
        **{k: pl.Series(k, v, dtype=pl.Float64 if k.endswith("_s") else pl.Int64) for k, v in columns.items()},
    })
    metrics = {"used_blocks": used, "evictions": evictions}
    if config.capacity_chunks is not None:
        metrics["capacity_blocks"] = np.full(len(used), config.capacity_chunks)
    metrics |= {"hit_blocks": columns["hit_blocks"], "miss_blocks": num_chunks - np.asarray(columns["hit_blocks"])}
    timeline = timeline_frame(np.arange(len(used)), trace.frame["arrival_s"].to_numpy(), SINGLE_TIER, metrics)
    return RunResult(requests, timeline, _summary(trace.source, config, requests, sum(evictions),
                                                  prefix_only_evicted), config)


def _check_trace(trace: object, chunk_size: int) -> None:
    """Refuse what :func:`replay_rag` cannot replay: not a Trace, no tokens, chunks across blocks."""
    if not isinstance(trace, Trace):
        raise ValueError(f"trace must be a kvlab Trace, got {type(trace).__name__}")
    trace.require_block_identity("a CacheBlend replay (kvlab.blend.replay_rag)")
    if "token_ids" not in trace.frame.columns:
        raise ValueError("trace needs a 'token_ids' column (blend matching reads tokens; e.g. kvlab.traces.rag)")
    if chunk_size % trace.block_size:
        raise ValueError(f"chunk_size={chunk_size} must be a multiple of the trace's block_size={trace.block_size}")


def _run(trace: Trace, config: RagConfig) -> tuple[dict[str, list], list[int], list[int], int]:
    """The per-request columns, the blend cache's chunks and evictions after each request, and
    the prefix-only cache's evictions in all."""
    chunk_size = config.chunk_size
    per_block = chunk_size // trace.block_size
    tokens_flat, token_offsets = _flatten(trace.frame["token_ids"])
    keys_flat, key_offsets = _flatten(trace.frame["block_keys"])
    prefix_only, blend = _LruChunks(config.capacity_chunks), _LruChunks(config.capacity_chunks)
    matcher = TokenRangeMatcher(chunk_size)
    split = {"recompute_ratio": config.recompute_ratio, "min_blend_tokens": config.min_blend_tokens}
    names = ("input_tokens", "hit_blocks", "hit_tokens", *_COUNTS, "prefix_only_saved_tokens",
             *(("ttft_saved_s", "prefix_only_ttft_saved_s") if config.model is not None else ()))
    columns: dict[str, list] = {name: [] for name in names}
    used, evictions = [], []
    for r in range(len(trace)):
        tokens = tokens_flat[token_offsets[r]:token_offsets[r + 1]]
        num_chunks = tokens.shape[0] // chunk_size
        chunk_keys = keys_flat[key_offsets[r] + per_block - 1:key_offsets[r + 1]:per_block][:num_chunks]
        key_list = chunk_keys.tolist()
        only = prefill_savings(tokens.shape[0], prefix_only.prefix_hits(key_list) * chunk_size, **split)
        hit_chunks = blend.prefix_hits(key_list)
        kept = leftmost_non_overlapping(matcher.match(tokens), hit_chunks * chunk_size)
        both = prefill_savings(tokens.shape[0], hit_chunks * chunk_size, kept, chunk_size=chunk_size, **split)
        if both.blended_tokens:
            blend.touch(int(m.storage_key) for m in kept)
        for cache in (prefix_only, blend):
            cache.touch(reversed(key_list))
        prefix_only.evict_over_capacity()
        matcher.register(tokens[:num_chunks * chunk_size], chunk_keys)
        evicted = blend.evict_over_capacity()
        if evicted:
            matcher.remove(np.asarray(evicted, dtype=np.uint64))
        used.append(len(blend))
        evictions.append(len(evicted))
        row = {"input_tokens": both.prompt_tokens, "hit_blocks": hit_chunks, "hit_tokens": both.prefix_hit_tokens,
               **{name: getattr(both, name) for name in _COUNTS}, "prefix_only_saved_tokens": only.saved_tokens}
        if config.model is not None:
            cost = {"device": config.device, "link": config.link, "block_size": chunk_size}
            row["ttft_saved_s"] = ttft_saved_s(both, config.model, config.gpu_flops, **cost)
            row["prefix_only_ttft_saved_s"] = ttft_saved_s(only, config.model, config.gpu_flops, **cost)
        for name, value in row.items():
            columns[name].append(value)
    return columns, used, evictions, prefix_only.evicted_chunks


def _flatten(column: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """A list column as flat values plus ``int64[n + 1]`` row offsets."""
    offsets = np.zeros(column.len() + 1, dtype=np.int64)
    np.cumsum(column.list.len().to_numpy(), out=offsets[1:])
    return column.explode(empty_as_null=False).drop_nulls().to_numpy(), offsets


def _summary(source: str, config: RagConfig, requests: pl.DataFrame, evicted: int,
             prefix_only_evicted: int) -> RagSummary:
    total = {c: requests[c].sum() for c in requests.columns if c not in ("request_id", "arrival_s")}
    prompt = int(total["input_tokens"])
    timed = config.model is not None
    return RagSummary(
        source=source, config=config, requests=requests.height, input_tokens=prompt,
        hit_blocks=int(total["hit_blocks"]), hit_tokens=int(total["hit_tokens"]),
        **{name: int(total[name]) for name in _COUNTS},
        saved_fraction=total["saved_tokens"] / prompt if prompt else 0.0, evicted_chunks=evicted,
        prefix_only_saved_tokens=int(total["prefix_only_saved_tokens"]),
        prefix_only_saved_fraction=total["prefix_only_saved_tokens"] / prompt if prompt else 0.0,
        prefix_only_evicted_chunks=prefix_only_evicted,
        ttft_saved_s=float(total["ttft_saved_s"]) if timed else None,
        prefix_only_ttft_saved_s=float(total["prefix_only_ttft_saved_s"]) if timed else None,
    )
