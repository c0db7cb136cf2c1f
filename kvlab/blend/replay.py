"""Replay a trace with token ids through prefix-only caching and through prefix + blend caching."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import polars as pl

from kvlab.blend.matcher import TokenRangeMatcher
from kvlab.blend.ranges import leftmost_non_overlapping
from kvlab.blend.savings import (
    DEFAULT_MIN_BLEND_TOKENS,
    DEFAULT_RECOMPUTE_RATIO,
    PrefillSavings,
    _count,
    prefill_savings,
    ttft_saved_s,
)
from kvlab.tiers.devices import Device
from kvlab.tiers.models import ModelSpec
from kvlab.traces.trace import Trace

__all__ = ["RagReplay", "replay_rag"]

_COUNTS = ("prefix_hit_tokens", "blended_tokens", "recomputed_blend_tokens", "fresh_tokens", "saved_tokens")


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
class RagReplay:
    """Result of :func:`replay_rag`: one row per request and a summary.

    ``frame`` columns: ``request_id``, ``prompt_tokens``; prefix-only caching:
    ``prefix_only_saved_tokens`` (its prefix hit); prefix + blend: ``prefix_hit_tokens``,
    ``blended_tokens``, ``recomputed_blend_tokens``, ``fresh_tokens``, ``saved_tokens`` (as
    :class:`~kvlab.blend.savings.PrefillSavings`); with a model also ``prefix_only_ttft_saved_s``
    and ``ttft_saved_s`` (seconds, :func:`~kvlab.blend.savings.ttft_saved_s`). ``summary`` holds
    the totals of those columns, ``requests``, ``prefix_only_saved_fraction`` and
    ``saved_fraction`` (of all prompt tokens), and ``prefix_only_evicted_chunks`` /
    ``evicted_chunks`` (LRU evictions of each cache).

    >>> import polars as pl
    >>> r = RagReplay(pl.DataFrame({"request_id": [0]}), {"requests": 1})
    >>> r.summary["requests"]
    1
    """

    frame: pl.DataFrame
    summary: dict[str, float]


def replay_rag(trace: Trace, *, chunk_size: int = 256, capacity_chunks: int | None = None,
               recompute_ratio: float = DEFAULT_RECOMPUTE_RATIO, min_blend_tokens: int = DEFAULT_MIN_BLEND_TOKENS,
               model: ModelSpec | None = None, gpu_flops: float | None = None, device: Device | None = None,
               link: Device | None = None) -> RagReplay:
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
    with ``block_size_tokens = chunk_size``.

    Args:
        trace: a trace with ``token_ids`` (e.g. :func:`kvlab.traces.rag`).
        chunk_size: tokens per cached chunk (a multiple of ``trace.block_size``; LMCache's 256). Counts
            may be ints or numpy integers.
        capacity_chunks: chunks each cache holds (int ≥ 1), or None for unbounded.
        recompute_ratio: share of blended tokens recomputed, in ``[0, 1]``.
        min_blend_tokens: minimum reusable non-prefix tokens to blend (int ≥ 0).
        model: model shape for the TTFT estimate, or None for token counts only.
        gpu_flops: dense FLOP/s of the prefill GPUs (required with ``model``).
        device: tier the reused KV is loaded from (a :class:`kvlab.tiers.Device`; None = already on
            the GPU). Only with ``model``.
        link: link from ``device`` to the GPU (a :class:`kvlab.tiers.Device`), or None. Only with ``model``.

    Returns:
        A :class:`RagReplay`.

    Raises:
        ValueError: a trace without ``token_ids``, a ``chunk_size`` that is not a positive
            multiple of the block size, a bad capacity, ``model`` without ``gpu_flops`` (or the
            reverse), ``device``/``link`` without ``model``, a ``device``/``link`` that is not a
            :class:`kvlab.tiers.Device`, or a bad ratio / threshold.

    Example:
        >>> from kvlab.traces import rag
        >>> trace = rag(4, num_documents=3, document_tokens=512, system_prompt_tokens=256, docs_per_request=2,
        ...             order="shuffled", seed=0)
        >>> trace.frame["document_ids"].to_list()
        [[2, 1], [1, 0], [2, 0], [1, 2]]
        >>> r = replay_rag(trace)          # request 1: system prompt hit, document 1 blended from request 0
        >>> r.frame["prefix_only_saved_tokens"].to_list(), r.frame["blended_tokens"].to_list()
        ([0, 256, 768, 768], [0, 512, 512, 512])
        >>> r.frame["saved_tokens"].to_list(), r.summary["saved_fraction"]
        ([0, 691, 1203, 1203], 0.6048828125)
    """
    chunk_size, capacity_chunks = _check_args(trace, chunk_size, capacity_chunks, model, gpu_flops, device, link)
    per_block = chunk_size // trace.block_size
    tokens_flat, token_offsets = _flatten(trace.frame["token_ids"])
    keys_flat, key_offsets = _flatten(trace.frame["block_keys"])
    prefix_only, blend = _LruChunks(capacity_chunks), _LruChunks(capacity_chunks)
    matcher = TokenRangeMatcher(chunk_size)
    columns: dict[str, list] = {name: [] for name in ("prompt_tokens", "prefix_only_saved_tokens", *_COUNTS)}
    ttft: dict[str, list[float]] = {"prefix_only_ttft_saved_s": [], "ttft_saved_s": []}
    for r in range(len(trace)):
        tokens = tokens_flat[token_offsets[r]:token_offsets[r + 1]]
        n_chunks = tokens.shape[0] // chunk_size
        chunk_keys = keys_flat[key_offsets[r] + per_block - 1:key_offsets[r + 1]:per_block][:n_chunks]
        key_list = chunk_keys.tolist()
        only = prefill_savings(tokens.shape[0], prefix_only.prefix_hits(key_list) * chunk_size,
                               recompute_ratio=recompute_ratio, min_blend_tokens=min_blend_tokens)
        prefix_tokens = blend.prefix_hits(key_list) * chunk_size
        kept = leftmost_non_overlapping(matcher.match(tokens), prefix_tokens)
        both = prefill_savings(tokens.shape[0], prefix_tokens, kept, recompute_ratio=recompute_ratio,
                               min_blend_tokens=min_blend_tokens, chunk_size=chunk_size)
        if both.blended_tokens:
            blend.touch(int(m.storage_key) for m in kept)
        for cache in (prefix_only, blend):
            cache.touch(reversed(key_list))
        prefix_only.evict_over_capacity()
        matcher.register(tokens[:n_chunks * chunk_size], chunk_keys)
        evicted = blend.evict_over_capacity()
        if evicted:
            matcher.remove(np.asarray(evicted, dtype=np.uint64))
        _append(columns, only, both)
        if model is not None:
            ttft["prefix_only_ttft_saved_s"].append(ttft_saved_s(only, model, gpu_flops, device=device, link=link,
                                                                 block_size_tokens=chunk_size))
            ttft["ttft_saved_s"].append(ttft_saved_s(both, model, gpu_flops, device=device, link=link,
                                                     block_size_tokens=chunk_size))
    frame = pl.DataFrame({"request_id": trace.frame["request_id"],
                          **{k: pl.Series(k, v, dtype=pl.Int64) for k, v in columns.items()},
                          **({k: pl.Series(k, v, dtype=pl.Float64) for k, v in ttft.items()} if model else {})})
    return RagReplay(frame, _summary(frame, prefix_only.evicted_chunks, blend.evicted_chunks))


def _check_args(trace: object, chunk_size: object, capacity_chunks: object, model: object, gpu_flops: object,
                device: object, link: object) -> tuple[int, int | None]:
    """Validate :func:`replay_rag`'s arguments; return ``chunk_size`` and ``capacity_chunks`` as Python ints."""
    if not isinstance(trace, Trace):
        raise ValueError(f"trace must be a kvlab Trace, got {type(trace).__name__}")
    if "token_ids" not in trace.frame.columns:
        raise ValueError("trace needs a 'token_ids' column (blend matching reads tokens; e.g. kvlab.traces.rag)")
    chunk_size = _count("chunk_size", chunk_size, minimum=1)
    if chunk_size % trace.block_size:
        raise ValueError(f"chunk_size={chunk_size} must be a multiple of the trace's block_size={trace.block_size}")
    if capacity_chunks is not None:
        capacity_chunks = _count("capacity_chunks", capacity_chunks, minimum=1)
    if (model is None) != (gpu_flops is None):
        raise ValueError(f"model and gpu_flops go together, got model={model!r}, gpu_flops={gpu_flops!r}")
    if model is None and (device is not None or link is not None):
        raise ValueError(f"device/link need model and gpu_flops (they only enter the TTFT estimate), got "
                         f"device={device!r}, link={link!r} with model=None")
    for name, value in (("device", device), ("link", link)):
        if value is not None and not isinstance(value, Device):
            raise ValueError(f"{name} must be a kvlab.tiers Device (e.g. kvlab.tiers.get_device), got {value!r}")
    return chunk_size, capacity_chunks


def _flatten(column: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """A list column as flat values plus ``int64[n + 1]`` row offsets."""
    offsets = np.zeros(column.len() + 1, dtype=np.int64)
    np.cumsum(column.list.len().to_numpy(), out=offsets[1:])
    return column.explode(empty_as_null=False).drop_nulls().to_numpy(), offsets


def _append(columns: dict[str, list], only: PrefillSavings, both: PrefillSavings) -> None:
    columns["prompt_tokens"].append(both.prompt_tokens)
    columns["prefix_only_saved_tokens"].append(only.saved_tokens)
    for name in _COUNTS:
        columns[name].append(getattr(both, name))


def _summary(frame: pl.DataFrame, prefix_only_evicted: int, evicted: int) -> dict[str, float]:
    totals = {c: frame[c].sum() for c in frame.columns if c != "request_id"}
    prompt = totals["prompt_tokens"]
    return {"requests": frame.height, **totals,
            "prefix_only_saved_fraction": totals["prefix_only_saved_tokens"] / prompt if prompt else 0.0,
            "saved_fraction": totals["saved_tokens"] / prompt if prompt else 0.0,
            "prefix_only_evicted_chunks": prefix_only_evicted, "evicted_chunks": evicted}
