"""An ipywidgets panel that re-runs a cache-level replay as the controls move."""

from __future__ import annotations

import altair as alt
import ipywidgets as widgets

from kvlab.core import RunResult
from kvlab.sim import TOUCH_ORDERS, ReplayConfig, replay
from kvlab.traces import Trace
from kvlab.viz import occupancy_chart

#: Slider value standing for an unbounded cache (ipywidgets reserves ``None`` for "no selection").
UNBOUNDED = "unbounded"


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
    function of the widget values) and updates the summary text and the occupancy
    chart (an ``altair.JupyterChart``). Display the panel itself, or ``panel.ui``.

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
        self.touch_order = widgets.ToggleButtons(options=list(TOUCH_ORDERS), description="touch order")
        self.warmup = widgets.FloatSlider(value=0.0, min=0.0, max=0.9, step=0.05, description="warm-up",
                                          continuous_update=False, readout_format=".2f")
        self.summary = widgets.HTML()
        self.result: RunResult = self.compute()
        self.chart = alt.JupyterChart(self._chart(self.result))
        self._show_summary(self.result)
        self.ui = widgets.VBox([widgets.HBox([self.capacity, self.warmup]), self.touch_order, self.summary,
                                self.chart])
        for control in (self.capacity, self.touch_order, self.warmup):
            control.observe(self._on_change, names="value")

    def config(self) -> ReplayConfig:
        """The replay configuration the controls currently describe."""
        capacity = None if self.capacity.value == UNBOUNDED else self.capacity.value
        return ReplayConfig(policy=self.policy, capacity_blocks=capacity,
                            touch_order=self.touch_order.value, warmup_fraction=round(self.warmup.value, 4))

    def compute(self) -> RunResult:
        """Replay the trace with the current control values (no widget is changed)."""
        return replay(self.trace, self.config())

    def refresh(self) -> None:
        """Recompute and push the result into the summary and the chart."""
        self.result = self.compute()
        self._show_summary(self.result)
        self.chart.chart = self._chart(self.result)

    def _on_change(self, _change: dict) -> None:
        self.refresh()

    def _chart(self, result: RunResult) -> alt.VConcatChart:
        capacity = result.config.capacity_blocks
        cap = "unbounded" if capacity is None else f"{capacity:,} blocks"
        measured = result.requests.filter("measured")["arrival_s"]
        warmup_end_s = measured[0] if result.summary.warmup_requests and len(measured) else None
        return occupancy_chart(result, title=f"{self.policy.upper()} cache, {cap}", warmup_end_s=warmup_end_s)

    def _show_summary(self, result: RunResult) -> None:
        s = result.summary
        self.summary.value = (
            f"<b>block hit ratio</b> {s.block_hit_ratio:.4f} &nbsp; <b>token hit ratio</b> "
            f"{s.token_hit_ratio:.4f} &nbsp; <b>evictions</b> {s.evictions:,} &nbsp; "
            f"<b>peak used</b> {s.peak_used_blocks:,} blocks &nbsp; ({s.requests:,} measured requests)")

    def _repr_mimebundle_(self, **kwargs: object) -> dict:
        return self.ui._repr_mimebundle_(**kwargs)


def replay_panel(trace: Trace, *, capacity_blocks: int | str | None = 10_000, policy: str = "lru") -> ReplayPanel:
    """Build a :class:`ReplayPanel` for ``trace`` (display it in a notebook cell)."""
    return ReplayPanel(trace, capacity_blocks=capacity_blocks, policy=policy)
