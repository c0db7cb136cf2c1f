"""An ipywidgets panel that re-runs a cache-level replay as the controls move."""

from __future__ import annotations

import time

import ipywidgets as widgets

from kvlab.core import RunResult
from kvlab.sim import TOUCH_ORDERS, ReplayConfig, replay
from kvlab.traces import Trace
from kvlab.viz import LiveChart
from kvlab.viz.run_charts import occupancy_data, occupancy_template

#: Slider value standing for an unbounded cache (ipywidgets reserves ``None`` for "no selection").
UNBOUNDED = "unbounded"
#: The touch orders as the toggle shows them.
TOUCH_ORDER_LABELS = {"head_most_recent": "head most recent (vLLM)", "tail_most_recent": "tail most recent"}
#: What the touch-order toggle changes, shown next to it.
TOUCH_ORDER_HELP = (
    "Which end of a request's blocks is marked most recently used. <b>head most recent</b> (vLLM frees a "
    "request's blocks tail first): a prefix is never evicted before its continuation, so no resident block "
    "is orphaned. <b>tail most recent</b> (an object cache such as libCacheSim): the prefix head goes "
    "first and leaves <i>orphans</i>, resident blocks whose parent is gone, which a prefix lookup can never "
    "reach. On chat traces prefixes come back soon, so the hit ratio moves only in the 3rd-4th decimal; "
    "the orphan share shows what changes.")


#: The occupancy chart's blocks axis ends this much above the capacity line.
AXIS_HEADROOM = 1.1


def capacity_options(distinct_blocks: int, lowest_blocks: int = 100) -> list[tuple[str, int | str]]:
    """Slider stops: 1-2-5 steps from ``lowest_blocks`` to the working set, then unbounded.

    Returns:
        ``(label, value)`` pairs, increasing; the last is ``("unbounded", UNBOUNDED)``.

    Example:
        >>> capacity_options(1200)
        [('100', 100), ('200', 200), ('500', 500), ('1,000', 1000), ('2,000', 2000), ('unbounded', 'unbounded')]
    """
    stops: list[int] = []
    scale = 1
    while not stops or stops[-1] < distinct_blocks:
        for m in (1, 2, 5):
            if m * scale >= lowest_blocks and (not stops or stops[-1] < distinct_blocks):
                stops.append(m * scale)
        scale *= 10
    return [(f"{c:,}", c) for c in stops] + [("unbounded", UNBOUNDED)]


class ReplayPanel:
    """Capacity, touch order and warm-up controls over a replay, with a live chart.

    The capacity slider's stops are block counts and ``"unbounded"``
    (:data:`UNBOUNDED`). Moving a control re-runs :func:`kvlab.sim.replay` (:meth:`compute`, a pure
    function of the widget values; orphans tracked) and updates the summary text and the
    occupancy chart, a :class:`kvlab.viz.LiveChart` (``panel.chart.chart`` is the altair
    chart). The chart's spec does not depend on the controls (the capacity, its label and the
    y-axis top, 1.1 × the capacity — unbounded: the peak in use — are data), so a move sends
    new rows only and the browser redraws the existing view. Display the panel itself, or
    ``panel.ui``. ``last_update_s`` is the CPU time of the last refresh (replay, summary,
    chart), seconds.

    Args:
        trace: the workload.
        capacity_blocks: initial capacity in blocks, ``None`` or ``"unbounded"``; a
            capacity that is not one of the 1-2-5 stops is added as a stop of its own.
        policy: eviction policy name.

    Raises:
        ValueError: not a :class:`~kvlab.traces.Trace`, an invalid capacity or an
            unknown policy.

    Example:
        >>> from kvlab.traces import chat_sessions, ChatWorkload
        >>> panel = ReplayPanel(chat_sessions(ChatWorkload(num_sessions=30, block_size=64)), capacity_blocks=300)
        >>> panel.capacity.value  # 300 is not a 1-2-5 stop: it becomes one
        300
        >>> panel.capacity.value = 500  # as a user moving the slider
        >>> panel.result.config.capacity_blocks
        500
    """

    def __init__(self, trace: Trace, *, capacity_blocks: int | str | None = 10_000, policy: str = "lru") -> None:
        if not isinstance(trace, Trace):
            raise ValueError(f"trace must be a kvlab Trace (see kvlab.load_trace), got {type(trace).__name__}")
        if capacity_blocks == UNBOUNDED:
            capacity_blocks = None
        ReplayConfig(policy=policy, capacity_blocks=capacity_blocks)  # validates both
        self.trace = trace
        self.policy = policy
        options = capacity_options(trace.distinct_blocks)
        if capacity_blocks is not None and capacity_blocks not in [v for _, v in options]:
            options = sorted(options[:-1] + [(f"{capacity_blocks:,}", capacity_blocks)], key=lambda o: o[1])
            options.append(("unbounded", UNBOUNDED))
        self.capacity = widgets.SelectionSlider(options=options, description="capacity", continuous_update=False,
                                                value=UNBOUNDED if capacity_blocks is None else capacity_blocks)
        self.touch_order = widgets.ToggleButtons(options=[(TOUCH_ORDER_LABELS[o], o) for o in TOUCH_ORDERS],
                                                 description="touch order", style={"button_width": "auto"})
        self.warmup = widgets.FloatSlider(value=0.0, min=0.0, max=0.9, step=0.05, description="warm-up",
                                          continuous_update=False, readout_format=".2f")
        self.capacity.style.description_width = self.warmup.style.description_width = "initial"
        self.summary = widgets.HTML()
        self.last_update_s = 0.0
        self.result: RunResult = self.compute()
        self.chart = LiveChart()
        self._draw(self.result)
        self._show_summary(self.result)
        help_text = widgets.HTML(f"<div style='max-width: 760px; line-height: 1.35'>{TOUCH_ORDER_HELP}</div>")
        self.ui = widgets.VBox([widgets.HBox([self.capacity, self.warmup]), self.touch_order, help_text,
                                self.summary, self.chart])
        for control in (self.capacity, self.touch_order, self.warmup):
            control.observe(self._on_change, names="value")

    def config(self) -> ReplayConfig:
        """The replay configuration the controls currently describe."""
        capacity = None if self.capacity.value == UNBOUNDED else self.capacity.value
        return ReplayConfig(policy=self.policy, capacity_blocks=capacity, touch_order=self.touch_order.value,
                            warmup_fraction=round(self.warmup.value, 4), track_orphans=True)

    def compute(self) -> RunResult:
        """Replay the trace with the current control values (no widget is changed)."""
        return replay(self.trace, self.config())

    def refresh(self) -> None:
        """Recompute and push the result into the summary and the chart."""
        start = time.process_time()
        self.result = self.compute()
        self._show_summary(self.result)
        self._draw(self.result)
        self.last_update_s = time.process_time() - start

    def _on_change(self, _change: dict) -> None:
        self.refresh()

    def _chart_frames(self, result: RunResult) -> dict:
        """The occupancy chart's rows for ``result`` (:func:`kvlab.viz.run_charts.occupancy_data`)."""
        capacity = result.config.capacity_blocks
        measured = result.requests.filter("measured")["arrival_s"]
        warmup_end_s = measured[0] if result.summary.warmup_requests and len(measured) else None
        # the blocks axis follows the capacity (its line just below the top), so the chart shows how
        # fast the cache fills and where it stays, at every capacity; unbounded: the peak in use
        y_max = None if capacity is None else AXIS_HEADROOM * capacity
        return occupancy_data(result, warmup_end_s=warmup_end_s, y_max=y_max)

    def _draw(self, result: RunResult) -> None:
        title = f"{self.policy.upper()} cache: blocks in use and hit ratio"
        self.chart.show(occupancy_template(title), self._chart_frames(result))

    def _show_summary(self, result: RunResult) -> None:
        s = result.summary
        capacity = result.config.capacity_blocks
        cap = "unbounded" if capacity is None else f"{capacity:,} blocks"
        orphans = "" if s.mean_orphaned_share is None else (
            f" &nbsp; <b>orphaned</b> {s.mean_orphaned_share:.3%} of resident blocks (mean)")
        self.summary.value = (
            f"<b>capacity</b> {cap} &nbsp; <b>block hit ratio</b> {s.block_hit_ratio:.4f} &nbsp; "
            f"<b>token hit ratio</b> {s.token_hit_ratio:.4f} &nbsp; <b>evictions</b> {s.evictions:,} &nbsp; "
            f"<b>peak used</b> {s.peak_used_blocks:,} blocks{orphans} &nbsp; ({s.requests:,} measured requests)")

    def _repr_mimebundle_(self, **kwargs: object) -> dict:
        return self.ui._repr_mimebundle_(**kwargs)


def replay_panel(trace: Trace, *, capacity_blocks: int | str | None = 10_000, policy: str = "lru") -> ReplayPanel:
    """Build a :class:`ReplayPanel` for ``trace`` (display it in a notebook cell)."""
    return ReplayPanel(trace, capacity_blocks=capacity_blocks, policy=policy)
