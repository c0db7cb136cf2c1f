"""The Mooncake figures recomputed on the bundled traces, against docs/specs/traces.md §5
(an independent standard-library computation, four decimals) and the papers' values (§4)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from kvlab.cli import main
from kvlab.cli.figures import MooncakeFigures, format_report
from kvlab.sim import mooncake_figures as mf
from kvlab.sim import replay
from kvlab.viz import cache_ratio_chart, figure9_chart, save_chart, table1_chart

NOTEBOOK05 = Path(__file__).resolve().parent.parent / "notebooks" / "05_reproduce_mooncake.ipynb"
#: traces.md §5.1 / §5.3 and §5.4 (full 512-token blocks only), four decimals.
SPEC_DEFINITIONS = {
    ("block hit ratio", "conversation"): 0.3664, ("block hit ratio", "synthetic"): 0.6396,
    ("token hit ratio", "conversation"): 0.3736, ("token hit ratio", "synthetic"): 0.6512,
    ("full blocks only", "conversation"): 0.382, ("full blocks only", "synthetic"): 0.659,
    ("token hit ratio, last 50 %", "conversation"): 0.3981, ("token hit ratio, last 50 %", "synthetic"): 0.8627,
}
#: traces.md §5.2: token hit ratio of LRU (forward touch order) by capacity in blocks (the
#: spec rounds tokens / 512 to the nearest block — 10^4 tokens is 20 blocks there — where
#: kvlab floors to the blocks that fit, 19; so the test passes blocks × 512 tokens).
SPEC_FIGURE9 = {
    20: (0.0265, 0.0005), 32: (0.0329, 0.0011), 128: (0.0418, 0.0070), 195: (0.0425, 0.0116),
    512: (0.0430, 0.0437), 1_953: (0.0542, 0.1421), 2_048: (0.0560, 0.1488), 8_192: (0.1847, 0.3849),
    19_531: (0.2908, 0.5768), 32_768: (0.3415, 0.6406), 195_312: (0.3736, 0.6512),
}
#: traces.md §5.1: conversation LRU token hit ratio by capacity (blocks).
SPEC_LRU_CONVERSATION = {1_000: 0.0454, 10_000: 0.2153, 30_000: 0.3321, 50_000: 0.3615, 100_000: 0.3708,
                         None: 0.3736}


@pytest.fixture(scope="module")
def traces(conversation, synthetic):
    return {"conversation": conversation, "synthetic": synthetic}


@pytest.fixture(scope="module")
def definitions(traces) -> pl.DataFrame:
    return mf.cache_ratio_definitions(traces)


def test_cache_ratio_definitions_match_the_spec(definitions) -> None:
    ours = {(r["definition"], r["trace"]): r["ours"] for r in definitions.iter_rows(named=True)}
    for key, expected in SPEC_DEFINITIONS.items():
        digits = len(str(expected).split(".")[1])
        assert round(ours[key], digits) == expected, key
    assert set(definitions["paper"].to_list()) == {0.40, 0.66}


def test_per_request_mean_matches_the_spec_block_ratio(conversation, synthetic) -> None:
    """§5.1 'mean per-request block ratio' (0.3843 / 0.4232) — the block analogue of our
    per-request token definition."""
    for trace, expected in ((conversation, 0.3843), (synthetic, 0.4232)):
        req = replay(trace).requests
        blocks = trace.frame["block_keys"].list.len()
        assert round(float((req["hit_blocks"] / blocks).mean()), 4) == expected


def test_full_blocks_only_comes_closest_to_table2(definitions) -> None:
    """Stated honestly: no definition gives both 40 % and 66 %; full-blocks-only has the
    smallest mean error, the 50 % warm-up fits conversation alone."""
    figs = MooncakeFigures(definitions, *[pl.DataFrame()] * 6)
    assert figs.closest_definition() == "full blocks only"
    per = {(r["definition"], r["trace"]): r["abs_error"] for r in definitions.iter_rows(named=True)}
    assert min(per, key=lambda k: per[k] if k[1] == "conversation" else 1) == ("token hit ratio, last 50 %",
                                                                                "conversation")
    assert all(err > 0.0005 for err in per.values())


def test_unknown_trace_name_is_rejected(conversation) -> None:
    with pytest.raises(ValueError, match=r"no paper value for trace\(s\) \['mine'\]"):
        mf.cache_ratio_definitions({"mine": conversation})


def test_figure9_curve_matches_the_spec(traces) -> None:
    curves = mf.figure9_curves(traces, [b * 512 for b in SPEC_FIGURE9], touch_order="tail_most_recent")
    assert curves.height == 2 * len(SPEC_FIGURE9)
    for row in curves.iter_rows(named=True):
        expected = SPEC_FIGURE9[row["capacity_blocks"]][0 if row["trace"] == "conversation" else 1]
        assert round(row["token_hit_ratio"], 4) == expected, row


def test_share_at_3m_tokens_is_37_and_48_percent(traces) -> None:
    """traces.md §5.4: 37 % of the conversation maximum (paper 41 %), 48 % of synthetic (46 %)."""
    shares = mf.share_at_3m_tokens(mf.figure9_curves(traces))
    got = {r["trace"]: (round(r["share_of_max"] * 100), r["paper"]) for r in shares.iter_rows(named=True)}
    assert got == {"conversation": (37, 0.41), "synthetic": (48, 0.46)}


def test_table1_lru_column_matches_the_spec(conversation) -> None:
    frame = mf.table1_shape(conversation, touch_order="tail_most_recent")
    lru = {r["capacity_blocks"]: r["ours"] for r in frame.filter(pl.col("policy") == "lru").iter_rows(named=True)}
    assert {c: round(v, 4) for c, v in lru.items()} == SPEC_LRU_CONVERSATION
    unbounded = frame.filter(pl.col("capacity_blocks").is_null())
    assert unbounded["ours"].round(4).to_list() == [0.3736] * 3  # no eviction: the policy cannot matter
    assert unbounded["paper"].to_list() == [0.51] * 3
    lfu = frame.filter(pl.col("policy") == "lfu")["ours"].to_list()
    assert lfu == sorted(lfu)


def test_table1_shape_lru_beats_lfu_beats_length_aware(conversation) -> None:
    """Notebook 05: from 10,000 blocks up LRU >= LFU (as the paper), and kvlab's LengthAware falls below
    both (keeping a request's deep blocks orphans them under prefix lookups)."""
    frame = mf.table1_shape(conversation)
    by = {(r["policy"], r["capacity_blocks"]): r["ours"] for r in frame.iter_rows(named=True)}
    assert all(by["lru", c] >= by["lfu", c] > by["length_aware", c] for c in (10_000, 30_000, 50_000))


def test_charts_carry_the_labels(traces, definitions, tmp_path) -> None:
    curves = mf.figure9_curves(traces)
    shares = mf.share_at_3m_tokens(curves)
    spec = figure9_chart(curves, shares).to_dict(format="vega")
    labels = {d["label"] for data in spec["data"] for d in data.get("values", []) if "label" in d}
    assert labels == {"conversation: 37% of max (paper 41%)", "synthetic: 48% of max (paper 46%)"}
    written = save_chart(cache_ratio_chart(definitions), tmp_path, "t2", ("svg",))
    assert written == [tmp_path / "t2.svg"] and "<svg" in written[0].read_text()[:400]
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['paper'\]"):
        table1_chart(pl.DataFrame({"policy": ["lru"], "capacity_blocks": [1], "ours": [0.1]}))
    with pytest.raises(ValueError, match="unknown chart format"):
        save_chart(cache_ratio_chart(definitions), tmp_path, "t2", ("gif",))


def test_kvlab_figures_writes_png_and_svg(tmp_path, capsys, monkeypatch) -> None:
    """`kvlab figures` on the full bundled traces: the report and the files of Table 2, Figure 9
    and Table 1. The two cluster figures (Figure 10, Figure 5: the whole traces through the timed
    cluster, minutes of CPU) run on each trace's first 60 requests here; their files, rows and
    values are checked in test_demo.py and test_sim_cluster_mooncake.py."""
    import kvlab.cli.figures
    from kvlab.sim.cluster import mooncake_figures as cmf

    figure10, scheduler_comparison = cmf.figure10, cmf.scheduler_comparison
    monkeypatch.setattr(cmf, "figure10", lambda traces, **kw: figure10({n: t.head(60) for n, t in traces.items()},
                                                                       **kw))
    monkeypatch.setattr(cmf, "scheduler_comparison", lambda trace, **kw: scheduler_comparison(trace.head(60), **kw))
    monkeypatch.setattr(kvlab.cli.figures, "CLUSTER_EXECUTOR", "serial")  # no process spawns here
    out = tmp_path / "figs"
    assert main(["figures", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "closest: full blocks only" in printed and "conversation   ours 37%   paper 41%" in printed
    for name in ("cache_ratio", "figure9", "table1"):
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "<svg" in (out / f"{name}.svg").read_text()[:400]
        assert pl.read_csv(out / f"{name}.csv").height > 0
    assert {"figure10.csv", "figure10_runs.csv", "figure5.csv"} <= {p.name for p in out.iterdir()}
    table2 = pl.read_csv(out / "cache_ratio.csv")
    assert json.loads(table2.filter(pl.col("definition") == "token hit ratio").select("trace", "ours").write_json())


def test_report_is_plain_text(definitions) -> None:
    figure10 = pl.DataFrame({"trace": ["conversation"], "router": ["local_cache_aware"], "metric": ["hit_rate"],
                             "kvlab": [1.7], "paper": [2.22], "error": [1.7 / 2.22 - 1]})
    figure5 = pl.DataFrame({"router": ["local_cache_aware", "conductor"], "ttft_mean_s": [2.67, 2.42],
                            "paper_ttft_mean_s": [3.58, 3.07]})
    figs = MooncakeFigures(definitions, pl.DataFrame(), pl.DataFrame({"trace": [], "share_of_max": [], "paper": []}),
                           pl.DataFrame({"policy": [], "capacity_blocks": [], "ours": [], "paper": []}),
                           pl.DataFrame(), figure10, figure5)
    text = format_report(figs)
    assert "full blocks only" in text and "0.6594" in text and "0.3819" in text
    assert "local_cache_aware  hit_rate              1.70    2.22     -23%" in text
    assert "order as the paper's: True; global/local 0.91 (paper 0.86)" in text


def test_no_definition_matches_both_table2_numbers(definitions) -> None:
    """Issue 14 item 23: within one point (the paper prints whole percents) the conversation
    40 % is met only by the last-50 % window (39.8 %) or the per-request mean (40.9 %), the
    synthetic 66 % only by the token hit ratio (65.1 %) or full blocks only (65.9 %)."""
    assert mf.cache_ratio_matches(definitions) == {
        "conversation": ["token hit ratio, last 50 %", "per-request mean token ratio"],
        "synthetic": ["token hit ratio", "full blocks only"]}
    assert mf.cache_ratio_matches(definitions, 0.005) == {  # rounding to the printed percent
        "conversation": ["token hit ratio, last 50 %"], "synthetic": ["full blocks only"]}
    with pytest.raises(ValueError, match="tolerance must be"):
        mf.cache_ratio_matches(definitions, -0.01)
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['abs_error'\]"):
        mf.cache_ratio_matches(definitions.drop("abs_error"))


def test_notebook05_says_which_definition_matches_which_number() -> None:
    nb = json.loads(NOTEBOOK05.read_text())
    markdown = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"]
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    assert not any("What this notebook reproduces" in m for m in markdown)
    assert "no definition matches both" in markdown[-1].lower()
    assert "last 50 %" in markdown[-1] and "per-request mean" in markdown[-1]
    assert "cache_ratio_matches" in code[-1] and code[-1].count("assert ") == 1


def test_paper_figure9_points_agree_with_table2_and_the_eye_reading() -> None:
    """Issue 14 item 24. The digitised curves level off at Table 2's cache ratios (40 %, 59 %,
    66 %) and agree with traces.md §4.2's by-eye reading within its ±0.01."""
    pts = mf.paper_figure9_points()
    assert pts.height == 4 * 12 and pts.filter(~pl.col("have_trace"))["trace"].unique().sort().to_list() == [
        "all", "tool&agent"]
    at = {(r["trace"], r["capacity_tokens"]): r["token_hit_ratio"] for r in pts.iter_rows(named=True)}
    for trace, table2 in (("conversation", 0.40), ("tool&agent", 0.59), ("synthetic", 0.66)):
        assert abs(at[trace, 10**9] - table2) <= 0.006, trace  # half a printed percent + 0.001 reading
    by_eye = {("conversation", 10**4): 0.045, ("conversation", 10**5): 0.07, ("conversation", 10**6): 0.085,
              ("conversation", 10**7): 0.33, ("conversation", 5 * 10**7): 0.40, ("tool&agent", 10**4): 0.17,
              ("tool&agent", 10**5): 0.36, ("tool&agent", 10**6): 0.39, ("tool&agent", 10**7): 0.56,
              ("synthetic", 10**4): 0.0, ("synthetic", 10**5): 0.01, ("synthetic", 10**6): 0.15,
              ("synthetic", 10**7): 0.59, ("all", 10**9): 0.53}
    for key, value in by_eye.items():
        assert abs(at[key] - value) <= 0.01, key


def test_figure9_conversation_gap_as_stated(traces) -> None:
    """The gap FIGURE9_NOTES states, measured: ours 0.03-0.04 below the paper's from 10^5 tokens
    up (0.027 at the plateau), flat at 0.043 from 10^4 to 3x10^5 tokens where the paper's rises;
    synthetic within 0.013."""
    curves = mf.figure9_curves(traces, [*mf.PAPER_FIGURE9_TOKENS, 300_000])
    gap = {(r["trace"], r["capacity_tokens"]): r for r in mf.figure9_gap(curves).iter_rows(named=True)}
    assert len(gap) == 2 * 12
    conversation = [gap["conversation", t]["gap"] for t in mf.PAPER_FIGURE9_TOKENS]
    assert 0 < conversation[0] < 0.005
    assert all(0.03 <= g <= 0.037 for g in conversation[1:8])  # 10^5 ... 10^7
    assert {round(g, 3) for g in conversation[8:]} == {0.027}  # 5x10^7 and up: the plateau
    ours = dict(zip(curves.filter(pl.col("trace") == "conversation")["capacity_tokens"],
                    curves.filter(pl.col("trace") == "conversation")["token_hit_ratio"]))
    assert {round(ours[t], 3) for t in (10**4, 10**5, 300_000)} <= {0.043, 0.042} and round(ours[10**6], 3) == 0.054
    assert [gap["conversation", t]["paper"] for t in (10**4, 10**5, 10**6)] == [0.045, 0.073, 0.087]
    assert all(abs(gap["synthetic", t]["gap"]) <= 0.013 for t in mf.PAPER_FIGURE9_TOKENS)
    notes = " ".join(mf.FIGURE9_NOTES)
    assert "0.03–0.04 below" in notes and "0.027 at the plateau" in notes and "0.043 from 10^4 to 3×10^5" in notes
    assert "unexplained" in notes and "no trace here" in notes
    with pytest.raises(ValueError, match="curves lack the paper's capacities"):
        mf.figure9_gap(mf.figure9_curves(traces, [10**5]))


def test_figure9_chart_overlays_the_paper(traces) -> None:
    curves = mf.figure9_curves(traces)
    spec = figure9_chart(curves, mf.share_at_3m_tokens(curves)).to_dict()
    rows = [r for d in spec["datasets"].values() for r in d if r.get("source") == "≈ paper (read off)"]
    assert sorted({r["trace"] for r in rows}) == ["all (no trace here)", "conversation", "synthetic",
                                                  "tool&agent (no trace here)"]
    subtitle = spec["title"]["subtitle"]  # the notes, wrapped to the chart's width (≤ 100 characters a line)
    assert len(rows) == 48 and " ".join(line.strip() for line in subtitle) == " ".join(mf.FIGURE9_NOTES)
    assert len(subtitle) > len(mf.FIGURE9_NOTES) and max(map(len, subtitle)) <= 100
    assert mf.PAPER_FIGURE9_SOURCE.startswith("≈ paper: Qin et al., Mooncake, FAST'25, Figure 9")
    tooltips = [layer["encoding"].get("tooltip") for layer in spec["layer"] if "encoding" in layer]
    assert any(t and t[0] == {"field": "source", "type": "nominal"} for t in tooltips)


def test_fifo_is_the_mooncake_simulators_with_tail_most_recent(traces) -> None:
    """Issue 14 item 25 on the bundled traces, last 50 % of requests: the hit tokens of the
    Mooncake team's simulator are kvlab's FIFO with touch_order="tail_most_recent" at every
    capacity; the default differs wherever the order decides an eviction."""
    frame = mf.kvcache_lab_fifo(traces)
    assert frame.height == 2 * (7 + 5)
    assert frame.filter(pl.col("touch_order") == "tail_most_recent")["same"].all()
    head_same = frame.filter((pl.col("touch_order") == "head_most_recent") & pl.col("same"))
    assert head_same.select("trace", "capacity_blocks").rows() == [("conversation", 100_000), ("synthetic", 30_000)]
    first = frame.row(0, named=True)  # conversation, 100 blocks, head first: 3,080,581 vs their 2,564,997
    assert (first["ours_hit_tokens"], first["theirs_hit_tokens"]) == (3_080_581, 2_564_997)
    with pytest.raises(ValueError, match=r"no simulator values for trace\(s\) \['mine'\]"):
        mf.kvcache_lab_fifo({"mine": traces["conversation"]})
