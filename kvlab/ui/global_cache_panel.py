"""An ipywidgets panel over Mooncake's global KV cache and Conductor on the timed cluster.

The controls describe a :class:`~kvlab.sim.cluster.mooncake_figures.MooncakeSetup` (worker count,
DRAM cache per worker) and its routing (one of the four schedulers of FAST'25 §5.3, Conductor's
``kvcache_balancing_threshold``, the KV-event delay and the load-snapshot interval, C18, C22);
:meth:`GlobalCachePanel.refresh` simulates the trace under ``cache_scope="local"`` and
``"global"`` (C20) with them and shows hit rate, TTFT and prefill GPU time. A run is a few
seconds for a few hundred requests, so the panel recomputes on its **Run** button, not on every
slider move.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, replace

import altair as alt
import ipywidgets as widgets
import polars as pl

from kvlab.core.validate import check_choice, check_positive, check_real
from kvlab.sim.cluster import ClusterConfig, ClusterResult, simulate
from kvlab.sim.cluster.mooncake_figures import SCHEDULERS, MooncakeSetup, figure_metrics, stale
from kvlab.sim.cluster.sweep import summary_row
from kvlab.traces import Trace
from kvlab.ui.replay_panel import capacity_options
from kvlab.viz.global_cache_charts import scope_comparison_chart
from kvlab.viz.live import LiveChart
from kvlab.viz.theme import human

#: The §5.3 schedulers (kvlab router names) with the paper's names (:func:`kvlab.viz.theme.human`).
ROUTER_LABELS = {name: human(name) for name in SCHEDULERS}
#: The scopes each run compares (C20).
SCOPES = ("local", "global")
#: Stops of the KV-event delay and load-snapshot interval sliders (seconds).
DELAY_STOPS_S = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
#: Figure 10's DRAM cache per node (FAST'25): always a stop of the cache slider.
PAPER_CACHE_TOKENS: int = MooncakeSetup.cache_tokens
#: The frame's columns shown in the panel's table, with the header each shows (units in it).
TABLE_HEADERS = {"cache_scope": "cache scope", "token_hit_ratio": "token hit ratio", "gpu_hit_ratio": "GPU hit ratio",
                 "remote_store_ratio": "share from the global store", "ttft_mean_s": "mean TTFT (s)",
                 "ttft_p99_s": "p99 TTFT (s)", "prefill_gpu_s_per_request": "prefill GPU time per request (s)",
                 "rejected_requests": "rejected requests"}
TABLE_COLUMNS = tuple(TABLE_HEADERS)


@dataclass(frozen=True)
class GlobalCacheSettings:
    """One reading of the panel's controls: what one run simulates.

    Fields: ``num_workers`` (prefill workers), ``cache_tokens`` (DRAM cache per worker, tokens),
    ``router`` (one of :data:`~kvlab.sim.cluster.mooncake_figures.SCHEDULERS`),
    ``kvcache_balancing_threshold`` (Conductor's copy threshold, FAST'25 Algorithm 1),
    ``event_delay_s`` (KV events reach the index this late) and ``snapshot_interval_s`` (load
    snapshots; 0: live).

    Raises:
        ValueError: a bad value, naming the field.

    Example:
        >>> s = GlobalCacheSettings(4, 1_000_000, "conductor", 2.0, 0.1, 0.0)
        >>> s.apply(MooncakeSetup()).config("global").router.kvcache_balancing_threshold, s.threshold_used
        (2.0, True)
        >>> GlobalCacheSettings(4, 1_000_000, "random", 2.0, 0.0, 0.0).apply(MooncakeSetup()).config().router
        'random'
    """

    num_workers: int
    cache_tokens: int
    router: str
    kvcache_balancing_threshold: float
    event_delay_s: float
    snapshot_interval_s: float

    def __post_init__(self) -> None:
        check_positive("num_workers", self.num_workers)
        check_positive("cache_tokens", self.cache_tokens)
        check_choice("router", self.router, SCHEDULERS)
        check_real("kvcache_balancing_threshold", self.kvcache_balancing_threshold, low=0.0, low_open=True)
        check_real("event_delay_s", self.event_delay_s, low=0.0)
        check_real("snapshot_interval_s", self.snapshot_interval_s, low=0.0)

    @property
    def threshold_used(self) -> bool:
        """Whether the router reads ``kvcache_balancing_threshold`` (Conductor with copies only)."""
        return self.router == "conductor"

    def apply(self, setup: MooncakeSetup) -> MooncakeSetup:
        """``setup`` with these settings' workers, cache, router and threshold."""
        return replace(setup, num_workers=self.num_workers, cache_tokens=self.cache_tokens, router=self.router,
                       kvcache_balancing_threshold=self.kvcache_balancing_threshold)


class GlobalCachePanel:
    """Workers, DRAM cache, scheduler, balancing threshold, event delay and snapshot interval
    over a local-vs-global cache run of the timed cluster (FAST'25 Figure 10 and §5.3, C18–C22).

    Each run simulates the trace (outputs cut as ``setup.workload`` does) twice, under
    ``cache_scope="local"`` and ``"global"``, with the same router, and shows the global/local
    ratios, a table and :func:`~kvlab.viz.global_cache_charts.scope_comparison_chart`. Moving a
    control only marks the display stale; **Run** (or :meth:`refresh`) recomputes — a run of a few
    hundred requests takes seconds. :meth:`compute` is the headless form: it runs the controls'
    values and returns the frame, changing no widget. Display the panel itself, or ``panel.ui``.

    Args:
        trace: the workload.
        setup: the cluster (default :class:`~kvlab.sim.cluster.mooncake_figures.MooncakeSetup`:
            10 workers × 3 M tokens); the controls start at its worker count, cache size,
            scheduler and ``kvcache_balancing_threshold``.

    Attributes:
        frame: the frame on display (:meth:`compute`'s columns).
        results: the two runs on display, ``{"local": ClusterResult, "global": ClusterResult}``.
        shown: the :class:`GlobalCacheSettings` they ran.

    Raises:
        ValueError: not a Trace, not a MooncakeSetup, a setup router that is not a §5.3 scheduler.

    Example:
        >>> from kvlab.traces import load_trace
        >>> setup = MooncakeSetup(num_workers=2, cache_tokens=200_000)
        >>> panel = GlobalCachePanel(load_trace("synthetic").head(30), setup)
        >>> panel.router.value, panel.threshold.value = "conductor", 2.0   # as a user would
        >>> frame = panel.compute()   # headless: the controls' values, no widget changed
        >>> frame["cache_scope"].to_list(), frame["kvcache_balancing_threshold"].to_list()
        (['local', 'global'], [2.0, 2.0])
        >>> bool(frame["token_hit_ratio"][1] >= frame["token_hit_ratio"][0])
        True
    """

    def __init__(self, trace: Trace, setup: MooncakeSetup | None = None) -> None:
        if not isinstance(trace, Trace):
            raise ValueError(f"trace must be a kvlab Trace (see kvlab.load_trace), got {type(trace).__name__}")
        setup = MooncakeSetup() if setup is None else setup
        if not isinstance(setup, MooncakeSetup):
            raise ValueError(f"setup must be a MooncakeSetup or None, got {type(setup).__name__}")
        check_choice("setup.router", setup.router, SCHEDULERS)
        threshold = setup.kvcache_balancing_threshold  # the slider spans at least 1.0 .. 5.0
        self.trace, self.setup = trace, setup
        self.workload = setup.workload(trace)
        self.workers = widgets.IntSlider(value=setup.num_workers, min=1, max=max(16, setup.num_workers),
                                         description="workers", continuous_update=False)
        self.cache_tokens = widgets.SelectionSlider(options=_cache_options(setup), value=setup.cache_tokens,
                                                    description="DRAM tokens", continuous_update=False)
        self.router = widgets.Dropdown(options=[(label, name) for name, label in ROUTER_LABELS.items()],
                                       value=setup.router, description="scheduler")
        self.threshold = widgets.FloatSlider(value=threshold, min=min(1.0, threshold), max=max(5.0, threshold),
                                             step=0.1, description="threshold", continuous_update=False,
                                             readout_format=".1f")
        self.event_delay = widgets.SelectionSlider(options=_delay_options(), value=0.0, description="event delay",
                                                   continuous_update=False)
        self.snapshot_interval = widgets.SelectionSlider(options=_delay_options(), value=0.0,
                                                         description="snapshot", continuous_update=False)
        self.run_button = widgets.Button(description="Run", button_style="primary", icon="play")
        self.status = widgets.HTML()
        self.summary = widgets.HTML()
        self.table = widgets.HTML()
        self.shown = self.settings()
        self.frame, self.results = self._simulate(self.shown)
        self.chart = LiveChart(self._chart(self.frame, self.shown))
        self._show()
        self.ui = widgets.VBox([widgets.HBox([self.workers, self.cache_tokens]),
                                widgets.HBox([self.router, self.threshold]),
                                widgets.HBox([self.event_delay, self.snapshot_interval]),
                                widgets.HBox([self.run_button, self.status]), self.summary, self.table, self.chart])
        self.run_button.on_click(lambda _button: self.refresh())
        for control in (self.workers, self.cache_tokens, self.router, self.threshold, self.event_delay,
                        self.snapshot_interval):
            control.observe(self._on_change, names="value")

    # ------------------------------------------------------------------ computation

    def settings(self) -> GlobalCacheSettings:
        """The controls' values now."""
        return GlobalCacheSettings(self.workers.value, self.cache_tokens.value, self.router.value,
                                   round(float(self.threshold.value), 4), float(self.event_delay.value),
                                   float(self.snapshot_interval.value))

    def config(self, cache_scope: str, settings: GlobalCacheSettings | None = None) -> ClusterConfig:
        """The :class:`~kvlab.sim.cluster.ClusterConfig` of one scope under ``settings`` (default:
        the controls now) — without the event delay and snapshot interval, which
        :func:`~kvlab.sim.cluster.mooncake_figures.stale` adds per run."""
        settings = settings or self.settings()
        check_choice("cache_scope", cache_scope, SCOPES)
        return settings.apply(self.setup).config(cache_scope)

    def compute(self, settings: GlobalCacheSettings | None = None) -> pl.DataFrame:
        """Simulate both scopes under ``settings`` (default: the controls now); changes no widget.

        Returns:
            One row per scope, local first: ``cache_scope``, ``router``, ``num_workers``,
            ``cache_tokens``, ``kvcache_balancing_threshold`` (f64, null when the router does
            not read it), ``event_delay_s``, ``snapshot_interval_s``, then
            :func:`~kvlab.sim.cluster.mooncake_figures.figure_metrics`' columns
            (``token_hit_ratio``, ``prefill_gpu_s_per_request``, ``ttft_mean_s``, ``ttft_p99_s`` ...).
        """
        return self._simulate(settings or self.settings())[0]

    def refresh(self) -> None:
        """Run the controls' values and show the result (the Run button's action)."""
        settings = self.settings()
        self.status.value = "<i>running…</i>"
        self.run_button.disabled = True
        try:
            self.frame, self.results = self._simulate(settings)
            self.shown = settings
            self.chart.chart = self._chart(self.frame, settings)
            self._show()
        finally:
            self.run_button.disabled = False

    def _simulate(self, settings: GlobalCacheSettings) -> tuple[pl.DataFrame, dict[str, ClusterResult]]:
        """Both scopes' frame (:meth:`compute`) and runs, through the public
        :func:`~kvlab.sim.cluster.mooncake_figures.stale` configuration (one run per scope)."""
        threshold = settings.kvcache_balancing_threshold if settings.threshold_used else None
        rows, ran = [], []
        for scope in SCOPES:
            config = self.config(scope, settings).replace(**stale(settings.event_delay_s, settings.snapshot_interval_s))
            ran.append(simulate(self.workload, config, time_scale=self.setup.time_scale))
            frame = figure_metrics(pl.DataFrame([summary_row(ran[-1].summary)]))
            rows.append(pl.DataFrame({"cache_scope": [scope], "router": [settings.router],
                                      "num_workers": [settings.num_workers], "cache_tokens": [settings.cache_tokens],
                                      "event_delay_s": [settings.event_delay_s],
                                      "snapshot_interval_s": [settings.snapshot_interval_s],
                                      "kvcache_balancing_threshold": pl.Series([threshold], dtype=pl.Float64)})
                        .hstack(frame))
        return pl.concat(rows), dict(zip(SCOPES, ran, strict=True))

    # ------------------------------------------------------------------ display

    def summary_html(self, frame: pl.DataFrame | None = None) -> str:
        """The global/local ratios of ``frame`` (default: the one on display) as HTML."""
        frame = self.frame if frame is None else frame
        local, glob = (frame.filter(pl.col("cache_scope") == s).row(0, named=True) for s in SCOPES)
        parts = [f"{label} <b>{_ratio(glob[column], local[column])}</b>"
                 for column, label in (("token_hit_ratio", "hit rate"), ("ttft_mean_s", "mean TTFT"),
                                       ("ttft_p99_s", "p99 TTFT"),
                                       ("prefill_gpu_s_per_request", "prefill GPU time"))]
        return "global / local: " + ", ".join(parts)

    def _show(self) -> None:
        self.summary.value = self.summary_html()
        self.table.value = _table_html(self.frame)
        self._on_change(None)

    def _chart(self, frame: pl.DataFrame, settings: GlobalCacheSettings) -> alt.HConcatChart:
        knobs = (f", threshold {settings.kvcache_balancing_threshold:g}" if settings.threshold_used else "")
        return scope_comparison_chart(frame, title=[
            f"{ROUTER_LABELS[settings.router]}{knobs}",
            f"{settings.num_workers} workers × {settings.cache_tokens:,} DRAM tokens; event delay "
            f"{settings.event_delay_s:g} s, snapshots {settings.snapshot_interval_s:g} s; "
            f"{self.workload.frame.height:,} requests"])

    def _on_change(self, _change: dict | None) -> None:
        self.threshold.disabled = self.router.value != "conductor"
        self.status.value = ("" if self.settings() == self.shown
                             else "<b>controls changed</b>: press Run to simulate them")

    def _repr_mimebundle_(self, **kwargs: object) -> dict:
        return self.ui._repr_mimebundle_(**kwargs)


def _table_html(frame: pl.DataFrame) -> str:
    """The panel's table: one row per scope, :data:`TABLE_HEADERS` as headers, ratios and seconds
    to 4 significant digits, counts with thousands separators."""
    def cell(value: object) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        return f"{value:,}" if isinstance(value, int) else html.escape(str(value))

    head = "".join(f"<th style='padding:2px 10px'>{html.escape(h)}</th>" for h in TABLE_HEADERS.values())
    rows = "".join("<tr>" + "".join(f"<td style='padding:2px 10px;text-align:right'>{cell(row[c])}</td>"
                                    for c in TABLE_COLUMNS) + "</tr>" for row in frame.iter_rows(named=True))
    return f"<table style='font-size:14px;border-collapse:collapse'><tr>{head}</tr>{rows}</table>"


def global_cache_panel(trace: Trace, setup: MooncakeSetup | None = None) -> GlobalCachePanel:
    """Build a :class:`GlobalCachePanel` for ``trace`` (display it in a notebook cell)."""
    return GlobalCachePanel(trace, setup)


def _cache_options(setup: MooncakeSetup) -> list[tuple[str, int]]:
    """1-2-5 stops from 10 k tokens to 10 M, the paper's 3 M and the setup's size, each holding a block."""
    top = max(10_000_000, setup.cache_tokens)
    options = [(label, v) for label, v in capacity_options(top, lowest_blocks=10_000)[:-1] if v >= setup.block_size]
    for extra in {PAPER_CACHE_TOKENS, setup.cache_tokens} - {v for _, v in options}:
        options.append((f"{extra:,}", extra))
    return sorted(options, key=lambda o: o[1])


def _delay_options() -> list[tuple[str, float]]:
    return [(f"{v:g} s", v) for v in DELAY_STOPS_S]


def _ratio(numerator: float | None, denominator: float | None) -> str:
    if numerator is None or denominator is None:
        return "n/a"
    return f"×{numerator / denominator:.2f}" if denominator else ("×1.00" if numerator == 0 else "∞")


__all__ = ["DELAY_STOPS_S", "PAPER_CACHE_TOKENS", "ROUTER_LABELS", "SCOPES", "GlobalCacheSettings", "GlobalCachePanel",
           "global_cache_panel"]
