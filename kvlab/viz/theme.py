"""kvlab's altair theme: charts readable in a room, one colour and one dash per policy, human labels.

Importing :mod:`kvlab.viz` registers the theme ``"kvlab"`` with altair (``alt.theme``) and enables
it, so every chart — kvlab's builders and charts written inline in a notebook — gets:

* fonts of at least :data:`FONT_PX` px: axis and legend labels 13 px, axis, legend and facet
  titles 14 px, chart titles 18 px, text marks 13 px;
* axis labels that are not clipped short (Vega-Lite hides overlapping labels of continuous axes
  itself; log axes get round ticks from :func:`log_ticks`);
* the categorical palette :data:`PALETTE`, which separates nine series (kvlab's nine eviction
  policies) for readers with a colour-vision deficiency and has no pale yellow.

The palette is the Okabe–Ito palette without its yellow (M. Okabe and K. Ito, *Color Universal
Design*, 2008, https://jfly.uni-koeln.de/color/) plus indigo ``#332288`` and wine ``#882255`` from
Paul Tol's *muted* scheme (P. Tol, *Colour Schemes*, SRON/EPS/TN/09-002, 2021,
https://personal.sron.nl/~pault/). Simulated with the full-severity protanopia, deuteranopia and
tritanopia matrices of Machado, Oliveira and Fernandes (2009), every pair of its colours stays at
least 16 CIELAB ΔE*76 apart (tests/test_viz_theme.py checks it).

Series that may coincide (five of the nine policies share a curve on some traces) need more than
colour: :func:`policy_encodings` gives each policy its colour, dash and marker
(:data:`POLICY_COLORS`, :data:`POLICY_DASHES`, :data:`POLICY_SHAPES`) under one title and one domain,
so Vega-Lite draws one legend with all three. :data:`LABELS` is kvlab's one mapping from snake_case
names (metrics, policies, touch orders, block states) to the words a chart shows (:func:`human`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import altair as alt
import polars as pl

from kvlab.policies import POLICIES

#: Name the theme is registered under (``alt.theme.active`` once :mod:`kvlab.viz` is imported).
THEME_NAME = "kvlab"
#: Smallest font of any text in a kvlab chart, px (axis and legend labels, text marks).
FONT_PX = 13
#: Axis, legend and facet-header titles, px.
TITLE_PX = 14
#: Chart titles, px (subtitles: :data:`FONT_PX`).
CHART_TITLE_PX = 18

#: The categorical palette, in the order altair assigns it (see the module docstring for its sources).
PALETTE = (
    "#0072B2",  # Okabe–Ito blue
    "#E69F00",  # Okabe–Ito orange
    "#009E73",  # Okabe–Ito bluish green
    "#D55E00",  # Okabe–Ito vermillion
    "#CC79A7",  # Okabe–Ito reddish purple
    "#56B4E9",  # Okabe–Ito sky blue
    "#882255",  # Tol muted wine
    "#332288",  # Tol muted indigo
    "#000000",  # Okabe–Ito black
)
#: Line dash patterns ([dash, gap, ...] px), one per series; the first is solid.
DASHES = ([1, 0], [7, 3], [2, 2], [10, 3, 2, 3], [4, 4], [12, 4], [1, 3], [6, 2, 2, 2, 2, 2], [3, 1])
#: Point markers (Vega shape names), one per series.
SHAPES = ("circle", "square", "triangle-up", "diamond", "cross", "triangle-down", "triangle-right",
          "triangle-left", "M0,-1L0.24,-0.33L0.95,-0.31L0.38,0.12L0.59,0.81L0,0.4L-0.59,0.81L-0.38,0.12L-0.95,-0.31"
          "L-0.24,-0.33Z")  # the ninth: a star (an SVG path in Vega's unit square)

#: How a chart names a policy (legends, axes, tooltips), in :data:`kvlab.policies.POLICIES` order.
POLICY_LABELS = {"lru": "LRU", "fifo": "FIFO", "lfu": "LFU", "s3fifo": "S3-FIFO", "sieve": "SIEVE", "arc": "ARC",
                 "length_aware": "length-aware", "leaf_first_lru": "leaf-first LRU", "belady": "Belady (optimal)"}
#: Each policy's colour, dash and marker (index i of :data:`PALETTE`, :data:`DASHES`, :data:`SHAPES`).
POLICY_COLORS = {p: PALETTE[i] for i, p in enumerate(POLICIES)}
POLICY_DASHES = {p: DASHES[i] for i, p in enumerate(POLICIES)}
POLICY_SHAPES = {p: SHAPES[i] for i, p in enumerate(POLICIES)}

#: snake_case name → the words a chart shows: the one mapping every kvlab chart uses (:func:`human`).
LABELS: dict[str, str] = {
    **POLICY_LABELS,
    # timeline metrics (kvlab.core.TIMELINE_METRICS) and result columns
    "used_blocks": "used", "capacity_blocks": "capacity", "evictions": "evictions", "hit_blocks": "hit blocks",
    "miss_blocks": "computed blocks", "hit_ratio_rolling": "rolling hit ratio", "token_hit_ratio": "token hit ratio",
    "block_hit_ratio": "block hit ratio", "running_requests": "running requests",
    "waiting_requests": "waiting requests", "fetching_requests": "fetching requests (FETCH_KVC)",
    "ttft_s": "TTFT (s)", "ttft_mean_s": "mean TTFT (s)", "ttft_p99_s": "p99 TTFT (s)",
    # touch orders and hit semantics (kvlab.core.semantics)
    "head_most_recent": "head most recent", "tail_most_recent": "tail most recent",
    # vLLM block states (kvlab.viz.engine_charts.BLOCK_STATES)
    "in_use": "in use", "cached_free": "cached, free",
    # routers: the FAST'25 §5.3 schedulers (kvlab.sim.cluster.mooncake_figures.SCHEDULERS)
    "load_balance": "load balancing", "local_cache_aware": "local cache-aware",
    "conductor": "global cache-aware (Conductor)",
    # tier write policies (kvlab.tiers)
    "write_through": "write-through", "write_back": "write-back",
    "write_through_selective": "write-through selective",
}


def human(name: object) -> str:
    """The words a chart shows for ``name``: :data:`LABELS` when it lists it, else the name with
    underscores as spaces (``"prefill_gpu_s"`` → ``"prefill gpu s"``); not a string: ``str(name)``.

    Example:
        >>> human("head_most_recent"), human("used_blocks"), human("s3fifo"), human("cache_scope")
        ('head most recent', 'used', 'S3-FIFO', 'cache scope')
    """
    if not isinstance(name, str):
        return str(name)
    return LABELS.get(name, name.replace("_", " "))


def humanize(frame: pl.DataFrame, *columns: str) -> pl.DataFrame:
    """``frame`` with the string values of ``columns`` replaced by :func:`human` labels.

    Raises:
        ValueError: not a polars DataFrame, or a column it does not have.

    Example:
        >>> humanize(pl.DataFrame({"policy": ["lru", "belady"]}), "policy")["policy"].to_list()
        ['LRU', 'Belady (optimal)']
    """
    if not isinstance(frame, pl.DataFrame):
        raise ValueError(f"frame must be a polars DataFrame, got {type(frame).__name__}")
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"frame lacks column(s) {missing}; has {frame.columns}")
    return frame.with_columns(pl.col(c).cast(pl.String).map_elements(human, return_dtype=pl.String)
                              for c in columns)


def series_encodings(field: str, domain: Iterable[object], *, title: str | None = None,
                     shapes: bool = True, legend: bool = True,
                     slots: Iterable[int] | None = None) -> dict[str, alt.SchemaBase]:
    """Colour, dash and (optionally) marker encodings of one nominal ``field`` over ``domain``, for
    ``chart.encode(**series_encodings(...))``: the i-th value gets ``PALETTE[i]``, ``DASHES[i]``
    and ``SHAPES[i]`` (cycling past nine), all three under one title and domain so Vega-Lite draws
    one merged legend.

    Args:
        field: the column naming a series.
        domain: its values in legend order (at least one).
        title: the legend title (default :func:`human` of ``field``).
        shapes: add the ``shape`` encoding (for marks with points).
        legend: ``False`` draws no legend.
        slots: the palette/dash/marker index of each domain value (default 0, 1, 2, ...).

    Returns:
        ``{"color": ..., "strokeDash": ..., "shape": ...}`` (``shape`` only when ``shapes``).

    Raises:
        ValueError: an empty domain, or ``slots`` of another length.
    """
    domain = list(domain)
    if not domain:
        raise ValueError("domain must name at least one series, got []")
    slots = list(range(len(domain))) if slots is None else list(slots)
    if len(slots) != len(domain):
        raise ValueError(f"slots must give one index per domain value ({len(domain)}), got {len(slots)}")
    title = human(field) if title is None else title
    leg = alt.Legend(title=title, symbolStrokeWidth=2.5, symbolSize=120) if legend else None
    enc = {"color": alt.Color(f"{field}:N", title=title, legend=leg, scale=alt.Scale(
               domain=domain, range=[PALETTE[i % len(PALETTE)] for i in slots])),
           "strokeDash": alt.StrokeDash(f"{field}:N", title=title, legend=leg, scale=alt.Scale(
               domain=domain, range=[DASHES[i % len(DASHES)] for i in slots]))}
    if shapes:
        enc["shape"] = alt.Shape(f"{field}:N", title=title, legend=leg, scale=alt.Scale(
            domain=domain, range=[SHAPES[i % len(SHAPES)] for i in slots]))
    return enc


def policy_encodings(field: str = "policy", policies: Iterable[str] | None = None, *, title: str = "policy",
                     shapes: bool = True, legend: bool = True) -> dict[str, alt.SchemaBase]:
    """:func:`series_encodings` of policies: each policy keeps its :data:`POLICY_COLORS`,
    :data:`POLICY_DASHES` and :data:`POLICY_SHAPES` whatever subset a chart shows.

    Args:
        field: the column naming the policy; its values must be the :data:`POLICY_LABELS` labels
            (apply :func:`humanize` to the frame first).
        policies: the policies the chart shows, as names (``"lru"``) or labels (``"LRU"``), in any
            order (legend order is :data:`~kvlab.policies.POLICIES` order, then unknown ones as
            given, after the nine); default all nine.
        title, shapes, legend: as :func:`series_encodings`.

    Example:
        >>> enc = policy_encodings(policies=["belady", "lru"])
        >>> enc["color"].to_dict()["scale"]
        {'domain': ['LRU', 'Belady (optimal)'], 'range': ['#0072B2', '#000000']}
    """
    slot = {POLICY_LABELS[p]: i for i, p in enumerate(POLICIES)}
    wanted = [human(p) for p in (POLICIES if policies is None else policies)]
    known = sorted({w for w in wanted if w in slot}, key=slot.__getitem__)
    unknown = list(dict.fromkeys(w for w in wanted if w not in slot))
    domain = known + unknown
    slots = [slot[w] for w in known] + [len(POLICIES) + i for i in range(len(unknown))]
    return series_encodings(field, domain, title=title, shapes=shapes, legend=legend, slots=slots)


def lines_with_markers(base: alt.Chart, encodings: dict[str, alt.SchemaBase], *, size: int = 80) -> alt.LayerChart:
    """``base`` (a chart with its data, x, y and tooltip) drawn as lines (colour + dash, 2.5 px) under
    hollow markers (colour + shape): where series coincide, each keeps a visible marker, and the
    markers' outlines stay solid (an overlay ``point=True`` would dash them too).

    Args:
        base: ``alt.Chart(frame).encode(x=..., y=..., tooltip=...)``, no mark yet.
        encodings: :func:`series_encodings` or :func:`policy_encodings` (with ``shape``).
        size: marker area, px².

    Raises:
        ValueError: ``encodings`` without a ``shape``.
    """
    if "shape" not in encodings:
        raise ValueError("encodings must include a shape (series_encodings(..., shapes=True))")
    lines = base.mark_line(strokeWidth=2.5, opacity=0.9).encode(color=encodings["color"],
                                                               strokeDash=encodings["strokeDash"])
    points = base.mark_point(filled=False, size=size, strokeWidth=2).encode(color=encodings["color"],
                                                                           shape=encodings["shape"])
    return alt.layer(lines, points)


def policy_scale() -> alt.Scale:
    """The colour scale of the policies (domain: :data:`POLICY_LABELS` labels, range: :data:`POLICY_COLORS`)."""
    return alt.Scale(domain=[POLICY_LABELS[p] for p in POLICIES], range=[POLICY_COLORS[p] for p in POLICIES])


def label_expr(values: Iterable[str], field: str = "datum.label") -> str:
    """A Vega expression that shows each of ``values`` as its :func:`human` label (legend or axis
    ``labelExpr``), so the data keeps its snake_case values (tooltips, tests) and the reader sees words.

    Example:
        >>> label_expr(["in_use", "free"])
        "datum.label === 'in_use' ? 'in use' : datum.label"
    """
    expr = field
    for value in reversed(list(values)):
        label = human(value)
        if label != value:
            expr = f"{field} === {value!r} ? {label!r} : {expr}"
    return expr


#: Vega expression labelling a count axis: ``950``, ``10,000``, ``500,000``, ``3 M``, ``10 M``, ``2 B``
#: (no ``10.456k``): use it only on axes whose tick values are round (:func:`log_ticks`).
COUNT_LABEL_EXPR = ("datum.value >= 1e9 ? format(datum.value / 1e9, '~g') + ' B' : "
                    "datum.value >= 1e6 ? format(datum.value / 1e6, '~g') + ' M' : format(datum.value, ',')")


def log_ticks(low: float, high: float, *, max_ticks: int = 8) -> list[float]:
    """Round tick values for a log axis over ``[low, high]``: the 1-2-5 series of each decade, or
    1-3, or the powers of ten alone, whichever first gives at most ``max_ticks`` values (and at
    least two); a range too narrow for any of them gets its two ends rounded to two significant
    digits.

    Raises:
        ValueError: ``low`` not > 0, ``high`` < ``low``, or ``max_ticks`` < 2.

    Example:
        >>> log_ticks(1_717, 40_000)
        [2000, 5000, 10000, 20000]
        >>> log_ticks(10_000, 2e9)
        [10000, 100000, 1000000, 10000000, 100000000, 1000000000]
        >>> log_ticks(10, 2e9)  # nine powers of ten: every other one
        [10, 1000, 100000, 10000000, 1000000000]
    """
    if not (isinstance(low, (int, float)) and isinstance(high, (int, float))) or not 0 < low <= high:
        raise ValueError(f"log_ticks needs 0 < low <= high, got low={low!r}, high={high!r}")
    if isinstance(max_ticks, bool) or not isinstance(max_ticks, int) or max_ticks < 2:
        raise ValueError(f"max_ticks must be an integer >= 2, got {max_ticks!r}")
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    ticks: list[float] = []
    for mantissas in ((1, 2, 5), (1, 3), (1,)):
        ticks = [m * 10 ** e for e in range(first, last + 1) for m in mantissas if low <= m * 10 ** e <= high]
        if 2 <= len(ticks) <= max_ticks:
            return ticks
    if len(ticks) > max_ticks:  # many decades: every k-th power of ten
        step = -(-len(ticks) // max_ticks)
        return ticks[::step]
    return sorted({float(f"{low:.2g}"), float(f"{high:.2g}")})


def count_axis(values: Iterable[float] | None = None, **kwargs: object) -> alt.Axis:
    """An axis of counts (blocks, tokens, requests) labelled with :data:`COUNT_LABEL_EXPR` at
    ``values`` (e.g. :func:`log_ticks`; ``None``: Vega's own ticks); ``kwargs`` go to ``alt.Axis``."""
    if values is not None:
        kwargs["values"] = list(values)
    return alt.Axis(labelExpr=COUNT_LABEL_EXPR, **kwargs)


def theme_config() -> alt.theme.ThemeConfig:
    """The ``"kvlab"`` theme: a Vega-Lite top-level ``config`` (fonts, palette, label overlap, line widths)."""
    axis = {"labelFontSize": FONT_PX, "titleFontSize": TITLE_PX, "labelLimit": 260,  # labelOverlap: Vega-Lite default
            "titleFontWeight": "normal", "titlePadding": 8}
    header = {"labelFontSize": TITLE_PX, "titleFontSize": TITLE_PX, "titleFontWeight": "normal", "labelLimit": 300}
    return {"config": {
        "axis": axis,
        "legend": {"labelFontSize": FONT_PX, "titleFontSize": TITLE_PX, "labelLimit": 320, "titleLimit": 320,
                   "titleFontWeight": "normal", "symbolStrokeWidth": 2.5},
        "header": header,
        "title": {"fontSize": CHART_TITLE_PX, "subtitleFontSize": FONT_PX, "anchor": "start", "offset": 10,
                  "limit": 0},
        "text": {"fontSize": FONT_PX},
        "mark": {"color": PALETTE[0]},  # one-series charts: the palette's blue
        "point": {"size": 60},
        "range": {"category": list(PALETTE)},
        "view": {"continuousWidth": 300, "continuousHeight": 300},  # altair's default size
    }}


@alt.theme.register(THEME_NAME, enable=True)
def _kvlab_theme() -> alt.theme.ThemeConfig:
    return theme_config()


def enable_theme() -> None:
    """Enable the ``"kvlab"`` theme again (after ``alt.theme.enable("default")``, say)."""
    alt.theme.enable(THEME_NAME)


__all__ = ["CHART_TITLE_PX", "COUNT_LABEL_EXPR", "DASHES", "FONT_PX", "LABELS", "PALETTE", "POLICY_COLORS",
           "POLICY_DASHES", "POLICY_LABELS", "POLICY_SHAPES", "SHAPES", "THEME_NAME", "TITLE_PX", "count_axis",
           "enable_theme", "human", "humanize", "label_expr", "lines_with_markers", "log_ticks", "policy_encodings",
           "policy_scale", "series_encodings", "theme_config"]
