"""The prefill-savings model (prefix hits, blended chunks, fresh tokens) and its TTFT estimate."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.blend.matcher import BlendMatch
from kvlab.blend.savings import PrefillSavings, prefill_savings, ttft_saved_s
from kvlab.tiers.cost import fetch_time_s, recompute_time_s
from kvlab.tiers.devices import Device, get_device
from kvlab.tiers.models import get_model

LLAMA = get_model("Llama-3-8B")
H100 = 989.5e12


def _m(cur_st: int, cur_ed: int, key: int = 0) -> BlendMatch:
    return BlendMatch(0, cur_ed - cur_st, cur_st, cur_ed, key)


def _naive_blended(matches: list[tuple[int, int]], prefix: int) -> list[tuple[int, int]]:
    """B17 by hand: drop matches starting in the prefix, then keep leftmost non-overlapping."""
    kept: list[tuple[int, int]] = []
    for s, e in sorted(m for m in matches if m[0] >= prefix):
        if not kept or s >= kept[-1][1]:
            kept.append((s, e))
    return kept


# -- PrefillSavings ----------------------------------------------------------------------------------------------

def test_savings_properties() -> None:
    s = PrefillSavings(1024, 256, 512, 77, 256, ((256, 512), (768, 1024)))
    assert (s.saved_tokens, s.computed_tokens) == (691, 333)
    assert s.saved_tokens + s.computed_tokens == s.prompt_tokens
    assert PrefillSavings(0, 0, 0, 0, 0).saved_fraction == 0.0


@pytest.mark.parametrize("kwargs, message", [
    ({"fresh_tokens": 255}, "must equal prompt_tokens=1024"),
    ({"recomputed_blend_tokens": 513}, "recomputed_blend_tokens=513 must be <= blended_tokens=512"),
    ({"blend_ranges": ((256, 768),)}, "blend_ranges must be sorted"),  # starts inside the prefix
    ({"blend_ranges": ((512, 768), (600, 856))}, "blend_ranges must be sorted"),  # overlap
    ({"blend_ranges": ((768, 1280),)}, "blend_ranges must be sorted"),  # past the prompt
    ({"blend_ranges": ((512, 768),)}, "cover 256 tokens but blended_tokens=512"),
    ({"prefix_hit_tokens": -1, "fresh_tokens": 769}, "prefix_hit_tokens must be an integer >= 0, got -1"),
    ({"blended_tokens": 512.0}, "blended_tokens must be an int"),
    ({"blend_ranges": ((512.0, 1024),)}, "blend_ranges start must be an int"),
])
def test_savings_invariants_raise(kwargs: dict, message: str) -> None:
    base = {"prompt_tokens": 1024, "prefix_hit_tokens": 512, "blended_tokens": 512, "recomputed_blend_tokens": 0,
            "fresh_tokens": 0, "blend_ranges": ((512, 1024),)}
    if "prefix_hit_tokens" in kwargs:
        base["blend_ranges"] = ((512, 1024),)
    with pytest.raises(ValueError, match=message):
        PrefillSavings(**{**base, **kwargs})


# -- prefill_savings -----------------------------------------------------------------------------------------------

def test_derived_d4_leftmost_dedup_after_the_prefix() -> None:
    matches = [_m(0, 4), _m(2, 6), _m(4, 8)]
    s = prefill_savings(8, 0, matches, recompute_ratio=0.0, min_blend_tokens=0)
    assert s.blend_ranges == ((0, 4), (4, 8)) and s.blended_tokens == 8 and s.fresh_tokens == 0
    s = prefill_savings(8, 4, matches, recompute_ratio=0.0, min_blend_tokens=0)
    assert s.blend_ranges == ((4, 8),) and s.blended_tokens == 4 and s.saved_tokens == 8


def test_prefix_match_does_not_shadow_a_usable_one() -> None:
    # (2, 6) starts in the prefix [0, 4): dropped first, so (5, 9) is kept (B17's order)
    s = prefill_savings(10, 4, [_m(2, 6), _m(5, 9)], recompute_ratio=0.0, min_blend_tokens=0)
    assert s.blend_ranges == ((5, 9),) and s.fresh_tokens == 2


@pytest.mark.parametrize("min_blend, blended", [(0, 512), (511, 512), (512, 512), (513, 0), (10_000, 0)])
def test_min_blend_tokens_threshold(min_blend: int, blended: int) -> None:
    matches = [_m(256, 512), _m(600, 856)]
    s = prefill_savings(1000, 256, matches, min_blend_tokens=min_blend)
    assert s.blended_tokens == blended
    assert s.fresh_tokens == 1000 - 256 - blended
    assert s.recomputed_blend_tokens == (77 if blended else 0)


def test_default_threshold_is_lmcache_256_tokens() -> None:
    assert prefill_savings(600, 0, [_m(0, 255)]).blended_tokens == 0
    assert prefill_savings(600, 0, [_m(0, 256)]).blended_tokens == 256


@pytest.mark.parametrize("ratio, blended, recomputed", [
    (0.15, 256, 38), (0.15, 512, 77), (0.15, 100, 15), (0.0, 512, 0), (1.0, 512, 512), (0.5, 1, 1), (0.1, 10, 1),
])
def test_recompute_ratio_rounds_half_up(ratio: float, blended: int, recomputed: int) -> None:
    s = prefill_savings(blended + 3, 3, [_m(3, 3 + blended)], recompute_ratio=ratio, min_blend_tokens=0)
    assert s.recomputed_blend_tokens == recomputed
    assert s.saved_tokens == 3 + blended - recomputed
    assert s.computed_tokens == recomputed


def test_no_matches_is_prefix_only() -> None:
    s = prefill_savings(1000, 512)
    assert (s.prefix_hit_tokens, s.blended_tokens, s.fresh_tokens, s.saved_tokens) == (512, 0, 488, 512)


@pytest.mark.parametrize("args, kwargs, message", [
    ((-1, 0), {}, "prompt_tokens must be an integer >= 0, got -1"),
    ((10, 11), {}, "prefix_hit_tokens must be <= prompt_tokens=10"),
    ((10, 0, [_m(4, 12)]), {}, r"matches\[0\] covers \[4, 12\)"),
    ((10, 0, [_m(3, 3)]), {}, r"matches\[0\] covers \[3, 3\)"),
    ((10, 0), {"recompute_ratio": 1.5}, r"recompute_ratio must be a finite number in \[0.0, 1.0\], got 1.5"),
    ((10, 0), {"recompute_ratio": -0.1}, r"recompute_ratio must be a finite number in \[0.0, 1.0\], got -0.1"),
    ((10, 0), {"min_blend_tokens": -1}, "min_blend_tokens must be an integer >= 0, got -1"),
    ((10, 0, [_m(0, 4)]), {"chunk_size": 8}, "spans 4 tokens, not chunk_size=8"),
    ((10, 0), {"chunk_size": 0}, "chunk_size must be an integer >= 1 or None, got 0"),
])
def test_bad_arguments_raise(args: tuple, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        prefill_savings(*args, **kwargs)


@settings(max_examples=200, deadline=None)
@given(prompt=st.integers(0, 300), data=st.data(), ratio=st.floats(0, 1), min_blend=st.integers(0, 60))
def test_properties_against_a_naive_b17(prompt: int, data: st.DataObject, ratio: float, min_blend: int) -> None:
    prefix = data.draw(st.integers(0, prompt))
    chunk = data.draw(st.integers(1, 40))  # matches all span one chunk, as the matcher's
    starts = data.draw(st.lists(st.integers(0, max(0, prompt - chunk)), max_size=12)) if chunk <= prompt else []
    ranges = [(s, s + chunk) for s in starts]
    result = prefill_savings(prompt, prefix, [_m(s, e) for s, e in ranges], recompute_ratio=ratio,
                             min_blend_tokens=min_blend)
    kept = _naive_blended(ranges, prefix)
    covered = sum(e - s for s, e in kept)
    expected = kept if covered >= min_blend else []
    assert list(result.blend_ranges) == expected
    assert result.prefix_hit_tokens + result.blended_tokens + result.fresh_tokens == prompt
    assert result.recomputed_blend_tokens == math.floor(ratio * result.blended_tokens + 0.5)
    assert prefix <= result.saved_tokens <= prompt
    lower = prefill_savings(prompt, prefix, [_m(s, e) for s, e in ranges], recompute_ratio=ratio / 2,
                            min_blend_tokens=min_blend)
    assert lower.saved_tokens >= result.saved_tokens  # less recompute never saves less


# -- ttft_saved_s ------------------------------------------------------------------------------------------------

def _gaps(s: PrefillSavings) -> list[tuple[int, int]]:
    """The fresh segments of a split (the complement of the prefix and the blend ranges)."""
    out, pos = [], s.prefix_hit_tokens
    for st_, ed in [*s.blend_ranges, (s.prompt_tokens, s.prompt_tokens)]:
        if st_ > pos:
            out.append((pos, st_))
        pos = ed
    return out


def test_ttft_without_recompute_is_full_prefill_minus_the_fresh_segments() -> None:
    s = prefill_savings(4096, 1024, [_m(1536, 1792), _m(2048, 2560), _m(3000, 3256)], recompute_ratio=0.0)
    full = recompute_time_s(4096, LLAMA, H100)
    fresh = sum(recompute_time_s(e - b, LLAMA, H100, b) for b, e in _gaps(s))
    assert ttft_saved_s(s, LLAMA, H100) == pytest.approx(full - fresh, rel=1e-12)


def test_ttft_recompute_share_scales_the_blend_part() -> None:
    kwargs = {"min_blend_tokens": 0}
    prefix_only = ttft_saved_s(prefill_savings(2048, 1024), LLAMA, H100)
    none = ttft_saved_s(prefill_savings(2048, 1024, [_m(1536, 2048)], recompute_ratio=0.0, **kwargs), LLAMA, H100)
    half = ttft_saved_s(prefill_savings(2048, 1024, [_m(1536, 2048)], recompute_ratio=0.5, **kwargs), LLAMA, H100)
    assert prefix_only == pytest.approx(recompute_time_s(1024, LLAMA, H100))
    assert half - prefix_only == pytest.approx((none - prefix_only) / 2)
    assert none - prefix_only == pytest.approx(recompute_time_s(512, LLAMA, H100, 1536))


def test_ttft_with_a_device_subtracts_the_load_of_each_part() -> None:
    s = prefill_savings(2048, 1024, [_m(1280, 1536), _m(1536, 1792)])
    nvme, pcie = get_device("nvme_gen4"), get_device("pcie_gen4_x16")
    block = LLAMA.kv_bytes_per_block(256)
    prefix_s = recompute_time_s(1024, LLAMA, H100)
    blend_s = (recompute_time_s(256, LLAMA, H100, 1280) + recompute_time_s(256, LLAMA, H100, 1536)) * (1 - 77 / 512)
    expected = max(0.0, prefix_s - fetch_time_s(4, block, nvme, pcie)) + max(0.0, blend_s - fetch_time_s(2, block,
                                                                                                      nvme, pcie))
    assert ttft_saved_s(s, LLAMA, H100, device=nvme, link=pcie) == pytest.approx(expected)
    assert 0 < expected < ttft_saved_s(s, LLAMA, H100)
    slow = Device("tape", capacity_bytes=10**15, read_bytes_per_s=1e6, write_bytes_per_s=1e6, latency_s=1.0,
                  concurrency=1)
    assert ttft_saved_s(s, LLAMA, H100, device=slow) == 0.0  # the engine would recompute


def test_ttft_of_nothing_saved_is_zero() -> None:
    assert ttft_saved_s(prefill_savings(1000, 0), LLAMA, H100, device=get_device("nvme_gen4")) == 0.0


@pytest.mark.parametrize("kwargs, message", [
    ({"savings": (1, 2)}, "savings must be a PrefillSavings"),
    ({"model": "Llama-3-8B"}, "model must be a ModelSpec"),
    ({"gpu_flops": 0}, "gpu_flops must be > 0"),
    ({"link": get_device("pcie_gen4_x16")}, "link needs a device"),
    ({"device": "nvme"}, "device must be a Device"),
    ({"block_size": 0}, "block_size must be an integer >= 1, got 0"),
])
def test_ttft_bad_arguments_raise(kwargs: dict, message: str) -> None:
    args = {"savings": prefill_savings(1000, 512), "model": LLAMA, "gpu_flops": H100, **kwargs}
    with pytest.raises(ValueError, match=message):
        ttft_saved_s(args.pop("savings"), args.pop("model"), args.pop("gpu_flops"), **args)
