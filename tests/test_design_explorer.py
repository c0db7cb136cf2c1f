"""The design explorer, driven headlessly: set controls, assert on results and chart data."""

from __future__ import annotations

import sys
import threading

import numpy as np
import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.sim import replay
from kvlab.tiers.cost import load_or_recompute
from kvlab.tiers.devices import get_device
from kvlab.tiers.models import get_model
from kvlab.tiers.replay import replay_tiered
from kvlab.ui import DesignExplorer, design_explorer
from kvlab.ui.design_explorer import TIER_DEVICES, _distinct_rows

#: The explorer's start before issue 18 (two tiers of 16 and 64 GiB): the exact values below use it.
TWO_TIERS = {"num_tiers": 2, "capacity_gib": (16.0, 64.0, 512.0)}


def chart_frame(panel: DesignExplorer, column: str) -> pl.DataFrame:
    (rows,) = [d for d in panel.chart.chart.to_dict()["datasets"].values() if d and column in d[0]]
    return pl.DataFrame(rows)


@pytest.fixture(scope="module")
def small(conversation):
    return conversation.head(2_000)


def test_gib_become_blocks_and_the_chart_follows(small) -> None:
    panel = design_explorer(small, **TWO_TIERS, debounce_s=0)
    # Llama-3.1-8B: 128 KiB per token x 512 tokens = 64 MiB per block
    assert panel.block_bytes == 64 * 2**20 and panel.capacity_blocks() == [256, 1024]
    panel.capacity_gib[0].value = 4.0
    assert panel.capacity_blocks() == [64, 1024]
    assert panel.result.tier_counters["capacity_blocks"].to_list() == [64, 1024]
    caps = chart_frame(panel, "capacity_gib")
    assert caps["capacity_gib"].to_list() == [4.0, 64.0]
    timeline = chart_frame(panel, "gib")
    assert timeline.group_by("tier").agg(pl.col("gib").max()).sort("tier")["gib"].to_list() <= [64.0, 4.0]
    assert caps["label"].to_list() == ["capacity 4 GiB = 64 blocks", "capacity 64 GiB = 1,024 blocks"]
    bars = chart_frame(panel, "served_by")
    assert bars["served_by"].to_list() == ["GPU", "CPU", "computed"]
    assert bars["blocks"].sum() == small.block_refs


def test_exclusive_split_matches_one_lru(small) -> None:
    """Write-back with promotion: the tiers' hits add up to one LRU of the summed blocks."""
    panel = DesignExplorer(small, **TWO_TIERS, debounce_s=0)
    total = sum(panel.capacity_blocks())
    assert panel.result.summary.hit_blocks == replay(small, capacity_blocks=total).summary.hit_blocks
    assert "GPU" in panel.summary.value and "est. TTFT saved" in panel.summary.value


def test_every_control_recomputes(small) -> None:
    panel = DesignExplorer(small, **TWO_TIERS, debounce_s=0)
    panel.num_tiers.value = 3
    assert panel.result.tier_names == ["GPU", "CPU", "NVMe"]
    panel.write_policy.value = "write_through"
    assert panel.result.config.write_policy == "write_through"
    panel.policy[1].value = "none"
    assert panel.result.engine == "kernel" and panel.result.tier_counters["policy"].to_list()[1] is None
    panel.policy[1].value = "s3fifo"
    assert [t.policy for t in panel.result.summary.tiers] == ["lru", "s3fifo", "lru"]
    panel.promote.value = False
    assert panel.result.config.promote is False
    panel.chunk.value = 2
    assert panel.block_size == 1024 and panel.result.summary.block_refs == small.rechunk(2).block_refs
    panel.model.value = "Llama-3.1-70B"
    assert panel.block_bytes == 2 * 320 * 1024 * 512  # 320 KiB per token, 1,024-token blocks
    expected = replay_tiered(small.rechunk(2), panel.tiers(), write_policy="write_through", promote=False)
    assert panel.result.requests.equals(expected.requests)


def test_moved_bytes_and_ttft_saved(small) -> None:
    panel = DesignExplorer(small, **TWO_TIERS, debounce_s=0)
    moved = panel.bytes_moved()
    counters = {r["tier"]: r for r in panel.result.tier_counters.iter_rows(named=True)}
    cpu = counters["CPU"]
    assert moved == {"→CPU": (cpu["written_blocks"] - cpu["promoted_in_blocks"]) * panel.block_bytes,
                     "CPU→": cpu["read_blocks"] * panel.block_bytes}
    assert cpu["written_blocks"] - cpu["promoted_in_blocks"] == cpu["demoted_in_blocks"] > 0  # write-back
    assert moved["CPU→"] > 0 and panel.ttft_saved_s() > 0
    full = panel.ttft_saved_s()
    panel.capacity_gib[0].value = 1 / 16
    panel.capacity_gib[1].value = 1 / 16  # one block each: only the shared first block still hits
    assert panel.result.summary.tier_hit_blocks == {"GPU": 1999, "CPU": 0}
    assert 0 < panel.ttft_saved_s() < full


def test_ttft_saved_is_the_sum_over_requests(small) -> None:
    """The TTFT saved, grouped by distinct (hits per tier) rows, equals the per-request sum of
    the docstring's definition: each tier's hit blocks loaded or recomputed after the context
    of the tiers above."""
    panel = DesignExplorer(small, **TWO_TIERS, debounce_s=0)
    panel.num_tiers.value = 3
    panel.capacity_gib[0].value, panel.capacity_gib[1].value = 1.0, 4.0
    settings, result, model = panel.shown, panel.result, get_model(panel.shown.model)
    names = result.tier_names
    expected = 0.0
    for row in result.requests.select([f"hit_blocks_{n}" for n in names]).iter_rows():
        context = 0
        for (_, device, link, _), num_blocks in zip(TIER_DEVICES, row):
            if num_blocks:
                expected += load_or_recompute(num_blocks, settings.block_size, model, get_device(device),
                                              panel.gpu_flops, link=None if link is None else get_device(link),
                                              context_tokens=context).saved_s
            context += num_blocks * settings.block_size
    assert len({tuple(r) for r in result.requests.select([f"hit_blocks_{n}" for n in names]).iter_rows()}) > 3
    assert panel.ttft_saved_s() == pytest.approx(expected, rel=1e-9)


@given(st.lists(st.tuples(*[st.integers(0, 40)] * 3), max_size=60))
def test_distinct_rows_counts_every_row_once(rows: list[tuple[int, int, int]]) -> None:
    array = np.array(rows, dtype=np.int64).reshape(len(rows), 3)
    combos, counts = _distinct_rows(array)
    assert sorted(zip(map(tuple, combos.tolist()), counts.tolist())) == sorted(
        {r: rows.count(r) for r in set(rows)}.items())


def test_debounce_waits_for_the_last_change(small) -> None:
    panel = DesignExplorer(small, **TWO_TIERS, debounce_s=0.05)
    before = panel.result
    panel.capacity_gib[0].value = 8.0
    panel.capacity_gib[0].value = 4.0
    assert panel.result is before  # not yet
    panel._timer.join()
    assert panel.result.tier_counters["capacity_blocks"].to_list() == [64, 1024]


def test_a_control_moved_during_a_refresh_waits_for_the_next(small, monkeypatch) -> None:
    """Issue 14 item 19: the tier count changes while the debounced refresh replays on its
    timer thread. Each refresh replays, summarises and draws its own snapshot; the one asked
    for later is shown even when the earlier one finishes last."""
    module = sys.modules["kvlab.ui.design_explorer"]
    panel = DesignExplorer(small, **TWO_TIERS, debounce_s=0.01)
    inside, release = threading.Event(), threading.Event()
    replayed_tiers, real = [], module.replay_tiered

    def hold_the_first(workload, tiers, **kwargs):
        replayed_tiers.append([t.name for t in tiers])
        if len(replayed_tiers) == 1:
            inside.set()
            assert release.wait(60)
        return real(workload, tiers, **kwargs)

    monkeypatch.setattr(module, "replay_tiered", hold_the_first)
    errors = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    panel.capacity_gib[0].value = 4.0  # refresh A: two tiers
    first = panel._timer
    assert inside.wait(60)  # A has read the controls and is replaying
    panel.num_tiers.value = 3  # refresh B: three tiers
    second = panel._timer
    second.join()  # B replays, draws and is shown while A still waits
    release.set()
    first.join()  # A finishes last
    assert errors == []
    assert replayed_tiers == [["GPU", "CPU"], ["GPU", "CPU", "NVMe"]]
    assert panel.result.tier_names == ["GPU", "CPU", "NVMe"] and panel.shown.capacity_gib == (4.0, 64.0, 512.0)
    assert chart_frame(panel, "capacity_gib")["capacity_gib"].to_list() == [4.0, 64.0, 512.0]
    assert panel.result.tier_counters["capacity_blocks"].to_list() == [64, 1024, 8192]


def test_a_refresh_uses_one_snapshot_of_the_controls(small, monkeypatch) -> None:
    """Controls moved between the snapshot and the chart change neither the chart nor the
    summary of that refresh (model and chunk change the GiB per block)."""
    module = sys.modules["kvlab.ui.design_explorer"]
    panel = DesignExplorer(small, **TWO_TIERS, debounce_s=60)  # the changes below only schedule refreshes
    real = module.replay_tiered

    def move_controls(workload, tiers, **kwargs):
        panel.model.value, panel.chunk.value, panel.num_tiers.value = "Llama-3.1-70B", 2, 1
        return real(workload, tiers, **kwargs)

    monkeypatch.setattr(module, "replay_tiered", move_controls)
    panel.refresh()
    panel._timer.cancel()
    # Llama-3.1-8B, 512-token blocks: 64 MiB each, so 16 GiB and 64 GiB are 256 and 1,024 blocks
    assert panel.shown.model == "Llama-3.1-8B" and panel.result.tier_names == ["GPU", "CPU"]
    assert chart_frame(panel, "capacity_gib")["capacity_gib"].to_list() == [16.0, 64.0]
    assert "<b>Llama-3.1-8B</b>, 512-token blocks (64 MiB each), write-back" in panel.summary.value
    cpu = panel.result.tier_counters.filter(pl.col("tier") == "CPU").row(0, named=True)
    assert panel.bytes_moved()["CPU→"] == cpu["read_blocks"] * 64 * 2**20
    assert f"CPU→ {cpu['read_blocks'] * 64 / 1024:,.1f} GiB" in panel.summary.value


def test_a_tier_too_small_for_one_block_is_named(small) -> None:
    """Llama-3.1-405B keeps 2 x 126 layers x 8 heads x 128 x 2 bytes = 504 KiB per token;
    a 4,096-token block (chunk x8) is 1.97 GiB, so a 1 GiB GPU tier holds none."""
    panel = DesignExplorer(small, **TWO_TIERS, debounce_s=0)
    panel.model.value = "Llama-3.1-405B"
    panel.chunk.value = 8
    assert panel.capacity_blocks() == [8, 32] and "0 blocks" not in panel.summary.value
    panel.capacity_gib[0].value = 1.0
    assert panel.capacity_blocks() == [0, 32] and panel.result.summary.tier_hit_blocks["GPU"] == 0
    assert panel.summary.value.startswith(
        "<b>⚠ GPU holds 0 blocks: 1 GiB is less than one 4,096-token block of Llama-3.1-405B (1.97 GiB); "
        "it caches nothing.</b><br><b>Llama-3.1-405B</b>, 4,096-token blocks")
    panel.capacity_gib[1].value = 1.0
    assert panel.summary.value.count("holds 0 blocks") == 2 and "⚠ CPU holds 0 blocks: 1 GiB" in panel.summary.value


def test_bad_arguments(small) -> None:
    with pytest.raises(ValueError, match="trace must be a kvlab Trace"):
        DesignExplorer("conversation")
    with pytest.raises(ValueError, match="unknown model"):
        DesignExplorer(small, model="GPT-5")
    assert DesignExplorer(small, gpu="h100-sxm", debounce_s=0).gpu_flops == 989.5e12
    with pytest.raises(ValueError, match=r"TPU"):
        DesignExplorer(small, gpu="TPU")
    with pytest.raises(ValueError, match="debounce_s must be a finite number >= 0.0, got -1"):
        DesignExplorer(small, **TWO_TIERS, debounce_s=-1)
    with pytest.raises(ValueError, match="num_tiers must be an integer in"):
        DesignExplorer(small, num_tiers=4)
    with pytest.raises(ValueError, match=r"capacity_gib must give 3 sizes \(GPU, CPU, NVMe\), got \(1.0,\)"):
        DesignExplorer(small, capacity_gib=(1.0,))


def test_defaults_show_every_tier_at_work(conversation) -> None:
    """Issue 18: the default design on the bundled conversation trace (three tiers of 32, 512
    and 4,096 GiB; 64 MiB blocks) serves a visible share from every tier, not 4.6 %."""
    panel = DesignExplorer(conversation, debounce_s=0)
    assert panel.capacity_blocks() == [512, 8192, 65536]
    assert panel.result.summary.tier_hit_blocks == {"GPU": 12_168, "CPU": 42_827, "NVMe": 48_975}
    assert round(panel.result.summary.block_hit_ratio, 4) == 0.3604
    assert [s.disabled for s in panel.capacity_gib] == [False, False, False]
    panel.num_tiers.value = 2
    assert [s.disabled for s in panel.capacity_gib] == [False, False, True]
    assert [p.disabled for p in panel.policy] == [False, False, True]


def test_a_capacity_move_sends_rows_only(small) -> None:
    """The chart's spec depends on the active tiers only: a capacity, model or policy move
    sends datasets and the browser updates the drawn view; a tier count change re-embeds."""
    panel = DesignExplorer(small, **TWO_TIERS, debounce_s=0)
    spec, embeds = panel.chart.spec, panel.chart.embeds
    for move in (lambda: setattr(panel.capacity_gib[0], "value", 4.0),
                 lambda: setattr(panel.model, "value", "Llama-3.1-70B"),
                 lambda: setattr(panel.policy[1], "value", "s3fifo")):
        revision = panel.chart.revision
        move()
        assert panel.chart.spec is spec and panel.chart.embeds == embeds
        assert panel.chart.revision == revision + 1
    # Llama-3.1-70B: 160 MiB blocks, so 4 GiB and 64 GiB hold 25 and 409 blocks
    assert panel.chart.columns("d1")["capacity_gib"] == [25 * 160 / 1024, 409 * 160 / 1024]
    assert panel.chart.columns("d1")["label"] == ["capacity 3.906 GiB = 25 blocks", "capacity 63.91 GiB = 409 blocks"]
    panel.num_tiers.value = 3
    assert panel.chart.embeds == embeds + 1
    assert panel.chart.spec["vconcat"][0]["vconcat"][2]["layer"][0]["encoding"]["y"]["title"] == "NVMe GiB"


def test_a_drag_between_stops_reads_as_the_stop(small) -> None:
    """Seen in the browser: a drag sent 2^8.9999 GiB, the readout showed 512 and the chart 511.9 GiB =
    8,191 blocks; the explorer reads a GiB slider on its nearest stop."""
    panel = design_explorer(small, **TWO_TIERS, debounce_s=0)
    panel.capacity_gib[1].value = 2**8.9999
    assert panel.settings().capacity_gib == (16.0, 512.0)
    assert panel.capacity_blocks() == [256, 8_192]
