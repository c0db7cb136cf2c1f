"""The prefill-savings model of non-prefix (CacheBlend) reuse: prefix hits, blended chunks, fresh tokens.

A prompt's tokens split into three disjoint parts:

* **prefix hits** — the contiguous run from token 0 served by prefix caching (exact KV, no work);
* **blended** — chunks found anywhere after the prefix by the blend matcher (index_blend.md B12),
  de-duplicated leftmost-first after the prefix (B17); their KV is reused at a new position and a
  share of their tokens (``recompute_ratio``, LMCache's ``blend_recompute_ratio`` default 0.15,
  B4) is recomputed to restore cross-attention (B2). Blending happens only when at least
  ``min_blend_tokens`` (LMCache's ``blend_min_tokens`` default 256) tokens are reusable;
* **fresh** — everything else, prefilled from scratch.

:func:`ttft_saved_s` turns a split into prefill seconds saved with :mod:`kvlab.tiers.cost`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvlab.blend.matcher import BlendMatch
from kvlab.blend.ranges import leftmost_non_overlapping, unique_token_coverage
from kvlab.core.validate import check_count, check_positive, check_real
from kvlab.tiers.cost import DEFAULT_MFU, fetch_time_s, recompute_time_s
from kvlab.tiers.devices import Device
from kvlab.tiers.models import ModelSpec

__all__ = ["DEFAULT_MIN_BLEND_TOKENS", "DEFAULT_RECOMPUTE_RATIO", "PrefillSavings", "prefill_savings",
           "ttft_saved_s"]

#: LMCache's default ``blend_recompute_ratio`` (index_blend.md B4).
DEFAULT_RECOMPUTE_RATIO = 0.15
#: LMCache's default ``blend_min_tokens`` (index_blend.md B4).
DEFAULT_MIN_BLEND_TOKENS = 256


def _check_matches(matches: object) -> list[BlendMatch]:
    """``matches`` as a list of :class:`BlendMatch` of Python ints; ValueError naming ``matches[i].field`` otherwise."""
    if matches is None or isinstance(matches, (str, bytes)) or not isinstance(matches, Iterable):
        raise ValueError(f"matches must be a sequence of BlendMatch (or 5-tuples), got {matches!r}")
    checked = []
    for i, m in enumerate(matches):
        if type(m) is BlendMatch and all(type(v) is int and v >= 0 for v in m):  # the matcher's own: as is
            checked.append(m)
            continue
        if not isinstance(m, tuple) or len(m) != len(BlendMatch._fields):
            raise ValueError(f"matches[{i}] must be a BlendMatch or a 5-tuple (old_st, old_ed, cur_st, cur_ed, "
                             f"storage_key), got {m!r}")
        checked.append(BlendMatch(*(check_count(f"matches[{i}].{name}", v) for name, v in zip(BlendMatch._fields, m))))
    return checked


@dataclass(frozen=True)
class PrefillSavings:
    """How one prompt's prefill splits into prefix hits, blended chunks and fresh tokens.

    Fields (all token counts, ints ≥ 0; numpy integers are converted): ``prompt_tokens``;
    ``prefix_hit_tokens`` (the run from
    token 0 served by prefix caching); ``blended_tokens`` (reused non-prefix tokens);
    ``recomputed_blend_tokens`` (the share of ``blended_tokens`` recomputed, CacheBlend's
    selective recompute, B2); ``fresh_tokens`` (prefilled from scratch); ``blend_ranges``
    (the blended ``(cur_st, cur_ed)`` query ranges: sorted, disjoint, inside
    ``[prefix_hit_tokens, prompt_tokens)``, their lengths summing to ``blended_tokens``).

    Invariants: ``prefix_hit_tokens + blended_tokens + fresh_tokens == prompt_tokens`` and
    ``recomputed_blend_tokens <= blended_tokens``. Raises ``ValueError`` naming the field when a
    count is not an int ≥ 0 or an invariant fails.

    >>> s = PrefillSavings(prompt_tokens=1024, prefix_hit_tokens=256, blended_tokens=512,
    ...                    recomputed_blend_tokens=77, fresh_tokens=256, blend_ranges=((512, 1024),))
    >>> s.saved_tokens, s.computed_tokens, s.saved_fraction
    (691, 333, 0.6748046875)
    """

    prompt_tokens: int
    prefix_hit_tokens: int
    blended_tokens: int
    recomputed_blend_tokens: int
    fresh_tokens: int
    blend_ranges: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        for field in ("prompt_tokens", "prefix_hit_tokens", "blended_tokens", "recomputed_blend_tokens",
                      "fresh_tokens"):
            object.__setattr__(self, field, check_count(field, getattr(self, field)))
        parts = self.prefix_hit_tokens + self.blended_tokens + self.fresh_tokens
        if parts != self.prompt_tokens:
            raise ValueError(f"prefix_hit_tokens + blended_tokens + fresh_tokens = {parts} must equal "
                             f"prompt_tokens={self.prompt_tokens}")
        if self.recomputed_blend_tokens > self.blended_tokens:
            raise ValueError(f"recomputed_blend_tokens={self.recomputed_blend_tokens} must be <= "
                             f"blended_tokens={self.blended_tokens}")
        ranges = tuple((check_count("blend_ranges start", st), check_count("blend_ranges end", ed))
                       for st, ed in self.blend_ranges)
        object.__setattr__(self, "blend_ranges", ranges)
        end = self.prefix_hit_tokens
        for st, ed in ranges:
            if st < end or ed <= st or ed > self.prompt_tokens:
                raise ValueError(f"blend_ranges must be sorted, disjoint, non-empty and inside "
                                 f"[prefix_hit_tokens={self.prefix_hit_tokens}, prompt_tokens={self.prompt_tokens}),"
                                 f" got {ranges}")
            end = ed
        covered = sum(ed - st for st, ed in ranges)
        if covered != self.blended_tokens:
            raise ValueError(f"blend_ranges cover {covered} tokens but blended_tokens={self.blended_tokens}")

    @property
    def saved_tokens(self) -> int:
        """Tokens not prefilled: ``prefix_hit_tokens + blended_tokens - recomputed_blend_tokens``."""
        return self.prefix_hit_tokens + self.blended_tokens - self.recomputed_blend_tokens

    @property
    def computed_tokens(self) -> int:
        """Tokens prefilled: ``fresh_tokens + recomputed_blend_tokens``."""
        return self.fresh_tokens + self.recomputed_blend_tokens

    @property
    def saved_fraction(self) -> float:
        """``saved_tokens / prompt_tokens`` (0.0 for an empty prompt)."""
        return self.saved_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def prefill_savings(prompt_tokens: int, prefix_hit_tokens: int, matches: Sequence = (), *,
                    recompute_ratio: float = DEFAULT_RECOMPUTE_RATIO,
                    min_blend_tokens: int = DEFAULT_MIN_BLEND_TOKENS,
                    chunk_size: int | None = None) -> PrefillSavings:
    """Split a prompt into prefix hits, blended chunks and fresh tokens (CacheBlend, B2/B4/B16/B17).

    ``matches`` (e.g. :meth:`TokenRangeMatcher.match` of the whole prompt) are de-duplicated as
    LMCache's lookup does (B17, :func:`~kvlab.blend.ranges.leftmost_non_overlapping`): matches
    starting inside the prefix are dropped first, then the leftmost non-overlapping ones are kept.
    Their union (B16, :func:`~kvlab.blend.ranges.unique_token_coverage`) is blended only if it
    holds at least ``min_blend_tokens`` tokens (else nothing is blended); the recomputed share is
    ``recompute_ratio × blended_tokens`` rounded half up to a whole token.

    What ``min_blend_tokens`` gates is kvlab's reading of LMCache's ``blend_min_tokens``: the
    reusable tokens AFTER the prefix (the kept matches' union), not the prompt length nor the
    prefix hit plus blend; the spec (index_blend.md B4) does not say which count it gates.

    Counts may be ints or numpy integers (not bools).

    Args:
        prompt_tokens: prompt length (int ≥ 0).
        prefix_hit_tokens: tokens from 0 served by prefix caching (``0 .. prompt_tokens``).
        matches: :class:`~kvlab.blend.matcher.BlendMatch` items, or plain 5-tuples ``(old_st,
            old_ed, cur_st, cur_ed, storage_key)`` (converted), every field an integer ≥ 0 and
            ``0 <= cur_st < cur_ed <= prompt_tokens``.
        recompute_ratio: share of blended tokens recomputed, in ``[0, 1]``.
        min_blend_tokens: minimum reusable non-prefix tokens to blend at all (int ≥ 0).
        chunk_size: when given, every match must span exactly this many tokens.

    Returns:
        A :class:`PrefillSavings` (with the kept matches' ranges as ``blend_ranges``).

    Raises:
        ValueError: a count or ratio out of range; ``matches`` None or not iterable; an item that is
            not a BlendMatch / 5-tuple of integers ≥ 0 (names ``matches[i]`` or ``matches[i].cur_st``
            etc.), outside the prompt or of the wrong length.

    Example:
        >>> from kvlab.blend.matcher import BlendMatch
        >>> m = [BlendMatch(0, 256, 256, 512, 7), BlendMatch(256, 512, 300, 556, 8), BlendMatch(0, 256, 600, 856, 9)]
        >>> s = prefill_savings(1000, 256, m)         # (300, 556) overlaps the kept (256, 512)
        >>> s.blended_tokens, s.recomputed_blend_tokens, s.fresh_tokens, s.blend_ranges
        (512, 77, 232, ((256, 512), (600, 856)))
        >>> prefill_savings(1000, 256, m, min_blend_tokens=1024).blended_tokens
        0
    """
    prompt_tokens = check_count("prompt_tokens", prompt_tokens)
    prefix_hit_tokens = check_count("prefix_hit_tokens", prefix_hit_tokens)
    if prefix_hit_tokens > prompt_tokens:
        raise ValueError(f"prefix_hit_tokens must be <= prompt_tokens={prompt_tokens}, got {prefix_hit_tokens}")
    ratio = check_real("recompute_ratio", recompute_ratio, low=0.0, high=1.0)
    min_blend_tokens = check_count("min_blend_tokens", min_blend_tokens)
    chunk_size = check_positive("chunk_size", chunk_size, optional=True)
    matches = _check_matches(matches)
    for i, m in enumerate(matches):
        if not 0 <= m.cur_st < m.cur_ed <= prompt_tokens:
            raise ValueError(f"matches[{i}] covers [{m.cur_st}, {m.cur_ed}); it must lie inside the "
                             f"prompt [0, {prompt_tokens})")
        if chunk_size is not None and m.cur_ed - m.cur_st != chunk_size:
            raise ValueError(f"matches[{i}] spans {m.cur_ed - m.cur_st} tokens, not chunk_size={chunk_size}")
    kept = leftmost_non_overlapping(matches, prefix_hit_tokens)
    blended = unique_token_coverage(kept)
    if blended < min_blend_tokens:
        kept, blended = [], 0
    recomputed = math.floor(ratio * blended + 0.5)
    return PrefillSavings(prompt_tokens=prompt_tokens, prefix_hit_tokens=prefix_hit_tokens, blended_tokens=blended,
                          recomputed_blend_tokens=recomputed,
                          fresh_tokens=prompt_tokens - prefix_hit_tokens - blended,
                          blend_ranges=tuple((m.cur_st, m.cur_ed) for m in kept))


def ttft_saved_s(savings: PrefillSavings, model: ModelSpec, gpu_flops: float, *, device: Device | None = None,
                 link: Device | None = None, block_size: int = 256, mfu: float = DEFAULT_MFU) -> float:
    """Estimated prefill seconds saved by a :class:`PrefillSavings`, vs prefilling the whole prompt.

    Compute saved (:func:`kvlab.tiers.cost.recompute_time_s`, each token attending over all
    tokens before it): the prefix hit as ``n = prefix_hit_tokens`` tokens after no context, and
    each blend range ``(st, ed)`` as ``ed - st`` tokens after ``st`` of context, times
    ``1 - recomputed_blend_tokens / blended_tokens`` (the recomputed share is spread evenly).
    Fresh tokens cost the same either way. With ``device`` (and optionally ``link``, e.g. PCIe),
    loading the reused KV — the prefix hit, and all blended tokens including those recomputed —
    costs :func:`kvlab.tiers.cost.fetch_time_s` of ``ceil(tokens / block_size)`` whole
    blocks; the prefix and the blend are each worth ``max(0, compute saved − load)`` (an engine
    recomputes rather than load slower, as :func:`kvlab.tiers.cost.ttft_saved_s`). Load and
    recompute are sequential here, so this is a lower bound on what CacheBlend's pipelining of
    the two saves (B2). Without ``device`` the KV is already on the GPU: loading is free.

    Args:
        savings: the split of one prompt.
        model: the model's shape (:func:`kvlab.tiers.models.get_model`).
        gpu_flops: dense FLOP/s of the GPUs doing the prefill (> 0).
        device: the tier the reused KV is loaded from, or None.
        link: the link from that tier to the GPU, or None.
        block_size: tokens per transferred block (int ≥ 1; LMCache's 256-token chunk).
        mfu: model-FLOPs utilisation in (0, 1].

    Returns:
        Seconds saved (≥ 0).

    Raises:
        ValueError: ``savings`` not a :class:`PrefillSavings`, or a bad model, device, rate or size.

    Example:
        >>> from kvlab.tiers.models import get_model
        >>> from kvlab.tiers.devices import get_device
        >>> s = PrefillSavings(2048, 1024, 512, 77, 512, ((1536, 2048),))
        >>> llama = get_model("Llama-3-8B")
        >>> round(ttft_saved_s(s, llama, 989.5e12) * 1e3, 2)          # ms, KV on the GPU
        48.74
        >>> round(ttft_saved_s(s, llama, 989.5e12, device=get_device("nvme_gen4")) * 1e3, 2)
        19.88
    """
    if not isinstance(savings, PrefillSavings):
        raise ValueError(f"savings must be a PrefillSavings, got {type(savings).__name__}")
    if not isinstance(model, ModelSpec):
        raise ValueError(f"model must be a ModelSpec, got {model!r}")
    block_bytes = model.kv_bytes_per_block(check_positive("block_size", block_size))
    prefix_s = recompute_time_s(savings.prefix_hit_tokens, model, gpu_flops, 0, mfu)
    blend_s = sum(recompute_time_s(ed - st, model, gpu_flops, st, mfu) for st, ed in savings.blend_ranges)
    if savings.blended_tokens:
        blend_s *= 1 - savings.recomputed_blend_tokens / savings.blended_tokens
    if device is None:
        if link is not None:
            raise ValueError("link needs a device (the tier the KV is loaded from), got device=None")
        return prefix_s + blend_s
    loads = [fetch_time_s(-(-tokens // block_size), block_bytes, device, link)
             for tokens in (savings.prefix_hit_tokens, savings.blended_tokens)]
    return max(0.0, prefix_s - loads[0]) + max(0.0, blend_s - loads[1])
