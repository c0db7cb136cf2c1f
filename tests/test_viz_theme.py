"""kvlab's altair theme: registered and enabled, a palette that survives colour-vision deficiency,
and every chart builder's spec readable in a room (fonts ≥ 13 px, no snake_case titles)."""

from __future__ import annotations

import re

import altair as alt
import numpy as np
import polars as pl
import pytest

import kvlab.viz  # importing kvlab.viz enables the theme
from conftest import font_sizes
from kvlab.core import RunResult, RunSummary, timeline_frame
from kvlab.policies import POLICIES
from kvlab.viz import theme

# --------------------------------------------------------------------------- colour science (exact, small)
#: Machado, Oliveira & Fernandes (2009), severity 1.0, applied to linear RGB.
CVD = {
    "protanopia": np.array([[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216],
                            [-0.003882, -0.048116, 1.051998]]),
    "deuteranopia": np.array([[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413],
                              [-0.011820, 0.042940, 0.968881]]),
    "tritanopia": np.array([[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.147602],
                            [0.004733, 0.691367, 0.303900]]),
}
#: The smallest CIELAB ΔE*76 the palette keeps between any two colours, normal and simulated vision.
MIN_DELTA_E = 16.0


def linear_rgb(colours: list[str]) -> np.ndarray:
    srgb = np.array([[int(c[i:i + 2], 16) / 255 for i in (1, 3, 5)] for c in colours])
    return np.where(srgb <= 0.04045, srgb / 12.92, ((srgb + 0.055) / 1.055) ** 2.4)


def cielab(linear: np.ndarray) -> np.ndarray:
    """sRGB (linear, D65) → CIELAB."""
    xyz = np.clip(linear, 0, 1) @ np.array([[0.4124564, 0.3575761, 0.1804375], [0.2126729, 0.7151522, 0.0721750],
                                            [0.0193339, 0.1191920, 0.9503041]]).T
    t = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(t > (6 / 29) ** 3, np.cbrt(t), t / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.stack([116 * f[:, 1] - 16, 500 * (f[:, 0] - f[:, 1]), 200 * (f[:, 1] - f[:, 2])], axis=1)


def min_delta_e(colours: list[str], vision: str | None = None) -> float:
    linear = linear_rgb(colours)
    if vision is not None:
        linear = linear @ CVD[vision].T
    lab = cielab(linear)
    distance = np.sqrt(((lab[:, None] - lab[None]) ** 2).sum(-1))
    return float(distance[~np.eye(len(colours), dtype=bool)].min())


def pale_yellow(colour: str) -> bool:
    """Light (L* > 80), saturated (C* > 25) and yellow (hue 60°–120°): unreadable as a line on white."""
    lightness, a, b = cielab(linear_rgb([colour]))[0]
    hue = np.degrees(np.arctan2(b, a)) % 360
    return bool(lightness > 80 and np.hypot(a, b) > 25 and 60 <= hue <= 120)


def test_the_colour_checks_can_fail() -> None:
    """tab10's red and green merge under deuteranopia; Okabe–Ito's yellow is pale yellow."""
    assert min_delta_e(["#d62728", "#2ca02c"]) > 50 and min_delta_e(["#d62728", "#2ca02c"], "deuteranopia") < 10
    assert pale_yellow("#F0E442") and pale_yellow("#DDCC77") and not pale_yellow("#E69F00")
    assert cielab(linear_rgb(["#FFFFFF"]))[0] == pytest.approx([100.0, 0.0, 0.0], abs=1e-3)


def test_palette_separates_nine_policies_under_colour_vision_deficiency() -> None:
    palette = list(theme.PALETTE)
    assert len(POLICIES) == 9 and len(set(palette)) == len(palette) >= len(POLICIES)
    assert min_delta_e(palette) >= MIN_DELTA_E
    for vision in CVD:
        assert min_delta_e(palette, vision) >= MIN_DELTA_E, vision
    assert not [c for c in palette if pale_yellow(c)]
    assert round(min(min_delta_e(palette, v) for v in CVD), 1) == 16.1  # tritanopia: sky blue vs bluish green


def test_each_policy_has_its_own_colour_dash_and_marker() -> None:
    for mapping in (theme.POLICY_COLORS, theme.POLICY_DASHES, theme.POLICY_SHAPES):
        assert list(mapping) == list(POLICIES)
        assert len({str(v) for v in mapping.values()}) == len(POLICIES)
    assert theme.POLICY_COLORS["lru"] == "#0072B2" and theme.POLICY_COLORS["belady"] == "#000000"
    enc = theme.policy_encodings(policies=["belady", "S3-FIFO", "lru", "mine"])
    specs = {channel: e.to_dict() for channel, e in enc.items()}
    assert specs["color"]["scale"] == {"domain": ["LRU", "S3-FIFO", "Belady (optimal)", "mine"],
                                       "range": ["#0072B2", "#D55E00", "#000000", "#0072B2"]}
    assert specs["strokeDash"]["scale"]["range"] == [[1, 0], [10, 3, 2, 3], [3, 1], [1, 0]]
    assert specs["shape"]["scale"]["range"] == ["circle", "diamond", theme.SHAPES[8], "circle"]
    # one legend: the same field, title and domain on all three channels
    assert {(s["field"], s["title"], tuple(s["scale"]["domain"])) for s in specs.values()} == {
        ("policy", "policy", ("LRU", "S3-FIFO", "Belady (optimal)", "mine"))}
    with pytest.raises(ValueError, match="domain must name at least one series"):
        theme.series_encodings("x", [])
    with pytest.raises(ValueError, match="slots must give one index per domain value"):
        theme.series_encodings("x", ["a"], slots=[0, 1])


def test_human_labels() -> None:
    assert [theme.human(n) for n in ("head_most_recent", "used_blocks", "capacity_blocks", "s3fifo",
                                     "leaf_first_lru", "write_through_selective", "cache_scope", 0.5)] == [
        "head most recent", "used", "capacity", "S3-FIFO", "leaf-first LRU", "write-through selective",
        "cache scope", "0.5"]
    frame = theme.humanize(pl.DataFrame({"policy": ["lru", "arc"], "n": [1, 2]}), "policy")
    assert frame.rows() == [("LRU", 1), ("ARC", 2)]
    with pytest.raises(ValueError, match=r"frame lacks column\(s\) \['nope'\]"):
        theme.humanize(frame, "nope")
    assert theme.label_expr(["in_use", "free", "cached_free"]) == (
        "datum.label === 'in_use' ? 'in use' : datum.label === 'cached_free' ? 'cached, free' : datum.label")


def test_log_ticks_are_round() -> None:
    assert theme.log_ticks(16, 3_417) == [20, 50, 100, 200, 500, 1000, 2000]
    assert theme.log_ticks(16, 40_000) == [30, 100, 300, 1000, 3000, 10000, 30000]  # 1-2-5 gives 10 (> 8)
    assert theme.log_ticks(16, 4_000_000) == [100, 1000, 10000, 100000, 1000000]  # 1-3 gives 11
    assert theme.log_ticks(1_500, 1_900) == [1500.0, 1900.0]  # no round value inside: the rounded ends
    with pytest.raises(ValueError, match="0 < low <= high"):
        theme.log_ticks(0, 10)
    with pytest.raises(ValueError, match="max_ticks must be an integer >= 2"):
        theme.log_ticks(1, 10, max_ticks=1)


def test_theme_is_registered_enabled_and_in_every_spec() -> None:
    assert theme.THEME_NAME in alt.theme.names() and alt.theme.active == theme.THEME_NAME
    config = alt.Chart(pl.DataFrame({"a": [1]})).mark_point().encode(x="a:Q").to_dict()["config"]
    assert config["axis"]["labelFontSize"] == config["legend"]["labelFontSize"] == config["text"]["fontSize"] == 13
    assert config["title"]["fontSize"] == 18 and config["range"]["category"] == list(theme.PALETTE)
    try:
        alt.theme.enable("default")
        assert "axis" not in alt.Chart(pl.DataFrame({"a": [1]})).mark_point().to_dict()["config"]
    finally:
        theme.enable_theme()
    assert alt.theme.active == "kvlab"


# --------------------------------------------------------------------------- every builder's spec
CHANNELS = ("x", "y", "color", "strokeDash", "shape", "size", "row", "column", "facet")
SNAKE = re.compile(r"[a-z0-9]_[a-z]")


def shown_titles(spec: object) -> list[str]:
    """The axis, legend and header titles a reader sees (an untitled field shows its name)."""
    titles = []
    if isinstance(spec, dict):
        for channel, enc in (spec.get("encoding") or {}).items():
            if channel not in CHANNELS or not isinstance(enc, dict) or "field" not in enc:
                continue
            guide = enc.get("axis", enc.get("legend", enc.get("header", {})))
            if guide is None:
                continue
            title = (guide or {}).get("title", enc.get("title", enc["field"]))
            if title is not None:
                titles.append(title)
        titles += [t for v in spec.values() for t in shown_titles(v)]
    elif isinstance(spec, list):
        titles += [t for v in spec for t in shown_titles(v)]
    return titles


def toy_cluster_result(ttft: list[float], worker: str = "w0") -> RunResult:
    n = len(ttft)
    requests = pl.DataFrame({"request_id": pl.Series(range(n), dtype=pl.UInt64), "arrival_s": [0.0] * n,
                             "input_tokens": [16] * n, "hit_blocks": [0] * n, "hit_tokens": [0] * n,
                             "ttft_s": pl.Series(ttft, dtype=pl.Float64)})
    timeline = timeline_frame(list(range(n)), [float(i) for i in range(n)], worker,
                              {"running_requests": [1] * n, "waiting_requests": [0] * n})
    return RunResult(requests, timeline, RunSummary(), {})


def builders() -> dict[str, alt.TopLevelMixin]:
    from kvlab.engines.scenarios import design_doc_example, radix_growth_example
    from kvlab.sim.cluster.mooncake_figures import figure10_ratios
    from kvlab.sim.mooncake_figures import CAPACITY_3M_TOKENS
    from kvlab.viz.global_cache_charts import figure10_chart, scheduler_chart, scope_comparison_chart, staleness_chart

    pool = design_doc_example("classic")
    pool.run_all()
    radix = radix_growth_example(page_size=4)
    radix.step()
    sweep = pl.DataFrame({"policy": [p for p in POLICIES for _ in range(3)],
                          "capacity_blocks": [16, 1_717, None] * len(POLICIES),
                          "token_hit_ratio": [0.1, 0.3, 0.4] * len(POLICIES)})
    curves = pl.DataFrame({"trace": ["conversation"] * 3, "capacity_tokens": [10_000, CAPACITY_3M_TOKENS, 10**8],
                           "token_hit_ratio": [0.04, 0.14, 0.37]})
    shares = pl.DataFrame({"trace": ["conversation"], "share_of_max": [0.37], "paper": [0.41]})
    fig10 = pl.DataFrame({"trace": ["conversation"] * 2, "router": ["conductor"] * 2,
                          "cache_scope": ["local", "global"], "token_hit_ratio": [0.2, 0.44],
                          "prefill_gpu_s_per_request": [2.0, 1.5]})
    scopes = fig10.with_columns(ttft_mean_s=pl.Series([1.0, 0.8]), ttft_p99_s=pl.Series([3.0, 2.0]))
    rates = pl.DataFrame({"rate": [1.0, 2.0], "variant": ["prefix caching on"] * 2, "ttft_mean_s": [0.1, 0.2],
                          "ttft_p99_s": [0.3, 0.5]})
    runs = {"on": toy_cluster_result([0.5, 1.0]), "off": toy_cluster_result([1.0, 2.0])}
    return {
        "block_pool_chart": kvlab.viz.block_pool_chart(pool.model.block_pool),
        "radix_tree_chart": kvlab.viz.radix_tree_chart(radix.model, title="radix"),
        "hit_ratio_curve": kvlab.viz.hit_ratio_curve(sweep, title="policies"),
        "cache_ratio_chart": kvlab.viz.cache_ratio_chart(pl.DataFrame({
            "definition": ["block hit ratio", "token hit ratio"], "trace": ["conversation"] * 2, "ours": [0.36, 0.37],
            "paper": [0.4, 0.4]})),
        "figure9_chart": kvlab.viz.figure9_chart(curves, shares),
        "table1_chart": kvlab.viz.table1_chart(pl.DataFrame({
            "policy": ["lru", "length_aware"], "capacity_blocks": [1_000, 1_000], "ours": [0.05, 0.04],
            "paper": [0.3, 0.3]})),
        "ttft_cdf_chart": kvlab.viz.ttft_cdf_chart(runs, log_x=True, title="cdf"),
        "worker_queue_chart": kvlab.viz.worker_queue_chart(runs["on"], title="queues"),
        "ttft_vs_rate_chart": kvlab.viz.ttft_vs_rate_chart(rates, title="rates"),
        "figure10_chart": figure10_chart(fig10, figure10_ratios(fig10), ["a note"]),
        "scheduler_chart": scheduler_chart(pl.DataFrame({
            "router": ["random", "local_cache_aware"], "ttft_mean_s": [9.0, 2.0], "paper_ttft_mean_s": [19.65, 3.07]})),
        "staleness_chart": staleness_chart(pl.DataFrame({
            "snapshot_interval_s": [0.0, 0.1], "event_delay_s": [0.0, 0.0], "ttft_p99_s": [1.0, 2.0]})),
        "scope_comparison_chart": scope_comparison_chart(scopes, title="scopes"),
    }


@pytest.fixture(scope="module")
def specs() -> dict[str, dict]:
    return {name: chart.to_dict() for name, chart in builders().items()}


def test_every_builder_is_checked(specs) -> None:
    from kvlab.viz import global_cache_charts

    builders_in_viz = {n for n in kvlab.viz.__all__ if n.endswith(("_chart", "_curve"))} - {
        "occupancy_chart", "hit_ratio_chart", "tier_breakdown_chart",  # run_charts: test_viz_run_charts.py
        "save_chart"}
    builders_in_viz |= {n for n in dir(global_cache_charts) if n.endswith("_chart")}
    assert builders_in_viz == set(specs)


def test_every_builder_has_fonts_of_13_px_or_more(specs) -> None:
    for name, spec in specs.items():
        sizes = font_sizes(spec)
        assert spec["config"]["axis"]["labelFontSize"] == 13, name  # the theme is in the spec
        assert min(sizes) >= theme.FONT_PX, (name, sorted(sizes)[:3])


def test_no_builder_shows_a_snake_case_title(specs) -> None:
    for name, spec in specs.items():
        titles = shown_titles(spec)
        assert titles, name
        assert not [t for t in titles if SNAKE.search(str(t))], (name, titles)
    assert "cache capacity (blocks, log scale)" in shown_titles(specs["hit_ratio_curve"])


def test_hit_ratio_curve_gives_each_policy_colour_dash_and_marker(specs) -> None:
    curves = specs["hit_ratio_curve"]["layer"][0]  # lines (colour + dash) under hollow markers (colour + shape)
    lines, points = curves["layer"]
    enc = {**lines["encoding"], "shape": points["encoding"]["shape"]}
    assert {c: enc[c]["scale"]["domain"][:2] for c in ("color", "strokeDash", "shape")} == {
        c: ["LRU", "FIFO"] for c in ("color", "strokeDash", "shape")}
    assert points["mark"] == {"type": "point", "filled": False, "size": 80, "strokeWidth": 2}
    assert points["encoding"]["shape"]["scale"]["range"][-1].startswith("M0,-1")  # Belady's star
    assert enc["color"]["scale"]["range"] == list(theme.PALETTE)
    assert enc["x"]["axis"]["values"] == [20, 50, 100, 200, 500, 1000]  # round ticks, not 1.717k
    assert enc["x"]["axis"]["labelExpr"] == theme.COUNT_LABEL_EXPR
    rows = pl.DataFrame(specs["hit_ratio_curve"]["datasets"][curves["data"]["name"]])
    assert sorted(set(rows["policy"])) == sorted(theme.POLICY_LABELS.values())
