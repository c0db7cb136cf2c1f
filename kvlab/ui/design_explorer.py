"""The design explorer: chunk size, model, tiers, policies → occupancy of every tier.

Each tier is sized in GiB; with the model's KV bytes per token and the chunk size that is
a capacity in blocks. Moving a control re-runs :func:`kvlab.tiers.replay.replay_tiered`
(the numba driver, whatever the tiers' policies) and redraws: resident GiB per tier over
time with capacity lines, the hit breakdown by tier, bytes moved per link and the estimated
TTFT saved (:func:`kvlab.tiers.cost.ttft_saved_s`, per request).
"""

from __future__ import annotations

import functools
import threading

import altair as alt
import ipywidgets as widgets
import numpy as np
import polars as pl

from kvlab.core.validate import check_real
from kvlab.tiers.cost import TierHit, load_or_recompute
from kvlab.tiers.devices import get_device
from kvlab.tiers.models import MODELS, ModelSpec, get_gpu_flops, get_model
from kvlab.tiers.replay import replay_tiered
from kvlab.tiers.result import TieredReplayResult
from kvlab.tiers.types import WRITE_POLICIES, TierSpec, tier_policies
from kvlab.traces import Trace
from kvlab.viz.run_charts import tier_breakdown_chart

#: The tiers the explorer offers, fastest first: (name, device, link to the GPU, default GiB).
TIER_DEVICES: tuple[tuple[str, str, str | None, float], ...] = (
    ("GPU", "h100_hbm", None, 16.0),
    ("CPU", "host_dram_ddr5_4800_8ch", "pcie_gen5_x16", 64.0),
    ("NVMe", "nvme_gen5", "pcie_gen5_x16", 512.0),
)
#: Policies a tier can run (those that do not read the whole trace), plus no eviction.
TIER_POLICIES = [*tier_policies(), "none"]
#: Most points per tier in the occupancy chart.
CHART_POINTS = 600
_GIB = 2**30


class DesignExplorer:
    """Sliders over a tiered KV store replaying a trace; charts of every tier.

    Models the design space of SGLang HiCache / LMCache / Dynamo KVBM (engines.md §2.2,
    §3, §4.1) on a real trace: chunk size (``Trace.rechunk``: coarser blocks keyed by
    their last block), model (KV bytes per token), 1–3 tiers with capacities in GiB and an
    eviction policy each, the write policy and promotion.

    Args:
        trace: a trace with block keys (``rechunk`` needs prefix-chained keys).
        model: a :data:`~kvlab.tiers.models.MODELS` name.
        gpu: a :data:`~kvlab.tiers.models.GPU_FLOPS` name (for the recompute estimate).

        debounce_s: wait this long after the last control change before recomputing
            (0: recompute at once — what the tests use).

    Every change runs the numba driver: tens of ms on the bundled traces (a combination of
    tier policies not seen before in the session first compiles, a few seconds;
    ``benchmarks/README.md``).

    Raises:
        ValueError: not a Trace, an unknown model or GPU, a negative debounce.

    Example:
        >>> from kvlab.traces import load_trace
        >>> panel = DesignExplorer(load_trace("synthetic").head(500), debounce_s=0)
        >>> panel.capacity_gib[0].value = 2.0   # GPU: 2 GiB = 32 blocks of 512 tokens (64 MiB each, Llama-3.1-8B)
        >>> panel.capacity_blocks()
        [32, 1024]
        >>> sorted(panel.result.summary.tier_hit_blocks)
        ['CPU', 'GPU']
    """

    def __init__(self, trace: Trace, *, model: str = "Llama-3.1-8B", gpu: str = "H100-SXM",
                 debounce_s: float = 0.3) -> None:
        if not isinstance(trace, Trace):
            raise ValueError(f"trace must be a kvlab Trace (see kvlab.load_trace), got {type(trace).__name__}")
        get_model(model)
        gpu_flops = get_gpu_flops(gpu)
        debounce_s = check_real("debounce_s", debounce_s, low=0.0)
        self.trace, self.gpu_flops, self.debounce_s = trace, gpu_flops, debounce_s
        self._timer: threading.Timer | None = None
        self._rechunked: dict[int, Trace] = {1: trace}
        self.chunk = widgets.Dropdown(options=[(f"{trace.block_size * k:,} tokens", k) for k in (1, 2, 4, 8)],
                                      value=1, description="chunk")
        self.model = widgets.Dropdown(options=list(MODELS), value=get_model(model).name, description="model")
        self.num_tiers = widgets.IntSlider(value=2, min=1, max=len(TIER_DEVICES), description="tiers")
        self.capacity_gib = [widgets.FloatLogSlider(value=gib, base=2, min=-4, max=14, step=0.5, description=name,
                                                    continuous_update=False, readout_format=".3g")
                             for name, _, _, gib in TIER_DEVICES]
        self.policy = [widgets.Dropdown(options=TIER_POLICIES, value="lru", description="policy",
                                        layout={"width": "220px"}) for _ in TIER_DEVICES]
        self.write_policy = widgets.ToggleButtons(options=list(WRITE_POLICIES), value="write_back",
                                                  description="writes")
        self.promote = widgets.Checkbox(value=True, description="promote lower-tier hits")
        self.summary = widgets.HTML()
        self.result = self.compute()
        self.chart = alt.JupyterChart(self.make_chart(self.result))
        self._show_summary()
        rows = [widgets.HBox([c, p]) for c, p in zip(self.capacity_gib, self.policy)]
        self.ui = widgets.VBox([widgets.HBox([self.chunk, self.model, self.num_tiers]), *rows,
                                widgets.HBox([self.write_policy, self.promote]), self.summary, self.chart])
        for control in (self.chunk, self.model, self.num_tiers, self.write_policy, self.promote,
                        *self.capacity_gib, *self.policy):
            control.observe(self._on_change, names="value")

    # ------------------------------------------------------------------ model of the controls

    @property
    def spec(self) -> ModelSpec:
        """The selected model."""
        return get_model(self.model.value)

    @property
    def block_size(self) -> int:
        """Tokens per block at the selected chunk size."""
        return self.trace.block_size * self.chunk.value

    @property
    def block_bytes(self) -> int:
        """KV bytes of one block of the selected model and chunk size."""
        return self.spec.kv_bytes_per_block(self.block_size)

    def capacity_blocks(self) -> list[int]:
        """Each active tier's capacity in blocks (GiB × 2^30 // block bytes)."""
        return [int(self.capacity_gib[i].value * _GIB) // self.block_bytes for i in range(self.num_tiers.value)]

    def tiers(self) -> list[TierSpec]:
        """The active tiers as :class:`~kvlab.tiers.types.TierSpec`."""
        return [TierSpec(TIER_DEVICES[i][0], cap, self.policy[i].value) for i, cap in enumerate(self.capacity_blocks())]

    def workload(self) -> Trace:
        """The trace at the selected chunk size (cached per size)."""
        k = self.chunk.value
        if k not in self._rechunked:
            self._rechunked[k] = self.trace.rechunk(k)
        return self._rechunked[k]

    def compute(self) -> TieredReplayResult:
        """Replay the workload through the tiers the controls describe (no widget changes)."""
        return replay_tiered(self.workload(), self.tiers(), write_policy=self.write_policy.value,
                             promote=self.promote.value)

    # ------------------------------------------------------------------ derived numbers

    def bytes_moved(self) -> dict[str, int]:
        """Bytes written into and read out of each tier below the top: ``"→CPU"`` counts
        every block written there from above (demotions, write-through and selective
        copies, spills; not promotions from a tier below), ``"CPU→"`` every block read from
        it (served to a request, or promoted to any tier above). Each transfer is counted
        once, at its destination (``→``) or at its source (``…→``)."""
        moved = {}
        for tier in self.result.summary.tiers[1:]:
            c = tier.counters
            moved[f"→{tier.name}"] = (c.written_blocks - c.promoted_in_blocks) * self.block_bytes
            moved[f"{tier.name}→"] = c.read_blocks * self.block_bytes
        return moved

    def ttft_saved_s(self) -> float:
        """Estimated prefill seconds saved over the measured requests: per request, the
        lookup's hit blocks in each tier (the prefix it found; a block evicted later in the
        same request is still counted where the lookup found it), loaded or recomputed,
        whichever is faster (:func:`kvlab.tiers.cost.load_or_recompute`)."""
        names = self.result.tier_names
        per_tier = np.stack([self.result.requests[f"hit_blocks_{n}"].to_numpy() for n in names], axis=1)
        combos, counts = np.unique(per_tier, axis=0, return_counts=True)
        saved = 0.0
        for combo, count in zip(combos.tolist(), counts.tolist()):
            context = 0
            for i, num_blocks in enumerate(combo):
                if num_blocks:
                    saved += count * _saved_s(self.model.value, TIER_DEVICES[i][1], TIER_DEVICES[i][2],
                                              int(num_blocks), self.block_size, context, self.gpu_flops)
                context += int(num_blocks) * self.block_size
        return saved

    # ------------------------------------------------------------------ display

    def make_chart(self, result: TieredReplayResult) -> alt.VConcatChart:
        """Resident GiB per tier over time (dashed: capacities) above the hit breakdown."""
        gib = self.block_bytes / _GIB
        used = result.timeline.filter(metric="used_blocks")
        steps = used["step"].unique().sort()
        if steps.len() > CHART_POINTS:  # evenly spaced steps, the first and the last included
            steps = steps.gather(np.unique(np.linspace(0, steps.len() - 1, CHART_POINTS).round().astype(np.int64)))
        timeline = used.filter(pl.col("step").is_in(steps.implode())).with_columns(
            resident_gib=pl.col("value") * gib)
        caps = pl.DataFrame({"tier": result.tier_names,
                             "capacity_gib": [c * gib for c in self.capacity_blocks()]})
        color = alt.Color("tier:N", sort=result.tier_names, title="tier")
        lines = alt.Chart(timeline).mark_line().encode(
            x=alt.X("time_s:Q", title="time (s)"), y=alt.Y("resident_gib:Q", title="resident KV (GiB)"), color=color,
            tooltip=["tier:N", "time_s:Q", alt.Tooltip("value:Q", title="blocks"),
                     alt.Tooltip("resident_gib:Q", format=".2f")])
        rules = alt.Chart(caps).mark_rule(strokeDash=[5, 3]).encode(y="capacity_gib:Q", color=color)
        bars = tier_breakdown_chart(result)
        title = (f"{self.spec.name}, {self.block_size:,}-token blocks "
                 f"({self.block_bytes / 2**20:,.0f} MiB), {self.write_policy.value}")
        return alt.vconcat(alt.layer(lines, rules).properties(width=560, height=220, title=title),
                           bars)

    def refresh(self) -> None:
        """Recompute now and push the result into the summary and the chart."""
        self.result = self.compute()
        self._show_summary()
        self.chart.chart = self.make_chart(self.result)

    def _on_change(self, _change: dict) -> None:
        if self.debounce_s == 0:
            self.refresh()
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = threading.Timer(self.debounce_s, self.refresh)
        self._timer.start()

    def _show_summary(self) -> None:
        s = self.result.summary
        per_tier = ", ".join(f"{t} {b:,}" for t, b in s.tier_hit_blocks.items())
        moved = ", ".join(f"{link} {b / _GIB:,.1f} GiB" for link, b in self.bytes_moved().items()) or "none"
        self.summary.value = (f"<b>block hit ratio</b> {s.block_hit_ratio:.4f} &nbsp; <b>hits by tier</b> "
                              f"{per_tier} &nbsp; <b>moved</b> {moved} &nbsp; <b>est. TTFT saved</b> "
                              f"{self.ttft_saved_s():,.1f} s over {s.requests:,} requests")

    def _repr_mimebundle_(self, **kwargs: object) -> dict:
        return self.ui._repr_mimebundle_(**kwargs)


@functools.lru_cache(maxsize=65536)
def _saved_s(model: str, device: str, link: str | None, num_blocks: int, block_size: int, context_tokens: int,
             gpu_flops: float) -> float:
    hit = TierHit(get_device(device), num_blocks, None if link is None else get_device(link))
    return load_or_recompute(hit.num_blocks, block_size, get_model(model), hit.device, gpu_flops,
                             link=hit.link, context_tokens=context_tokens).saved_s


def design_explorer(trace: Trace, **kwargs: object) -> DesignExplorer:
    """Build a :class:`DesignExplorer` for ``trace`` (display it in a notebook cell)."""
    return DesignExplorer(trace, **kwargs)


__all__ = ["TIER_DEVICES", "TIER_POLICIES", "DesignExplorer", "design_explorer"]
