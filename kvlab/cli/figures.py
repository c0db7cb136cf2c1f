"""``kvlab figures``: the published Mooncake numbers recomputed on the bundled traces.

Writes to the output folder, each chart as PNG and SVG:

* ``cache_ratio.{png,svg}`` + ``cache_ratio.csv`` — FAST'25 Table 2 "cache ratio"
  (conversation 40 %, synthetic 66 %) against ours under each definition;
* ``figure9.{png,svg}`` + ``figure9.csv`` — FAST'25 Figure 9, LRU hit ratio vs capacity in
  tokens with the "x % of maximum at 3 M tokens" labels (paper 41 % / 46 %);
* ``table1.{png,svg}`` + ``table1.csv`` — arXiv 2407.00079 Table 1's shape (LRU / LFU /
  LengthAware) on the conversation trace beside the paper's values for its own trace.

and prints the three tables with the definition that comes closest to Table 2. ``kvlab figures``
shows its progress on stderr (a tqdm bar, one step per trace and per figure).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from kvlab.cli.files import step_bar
from kvlab.sim import mooncake_figures as mf
from kvlab.traces import load_trace

#: Chart formats ``kvlab figures`` writes.
FIGURE_FORMATS = ("png", "svg")


@dataclass(frozen=True)
class MooncakeFigures:
    """The frames behind the three figures (see :mod:`kvlab.sim.mooncake_figures`)."""

    cache_ratio: pl.DataFrame
    figure9: pl.DataFrame
    shares: pl.DataFrame
    table1: pl.DataFrame

    def closest_definition(self) -> str:
        """The cache-ratio definition with the smallest mean absolute error to Table 2."""
        best = self.cache_ratio.group_by("definition", maintain_order=True).agg(pl.col("abs_error").mean())
        return best.sort("abs_error", maintain_order=True)["definition"][0]


#: Traces the figures are computed on (bundled names).
FIGURE_TRACES = ("conversation", "synthetic")
#: Steps of :func:`compute_figures` after the traces are loaded, then of :func:`write_figures`.
COMPUTE_STEPS = ("Figure 9 curves", "Table 2 cache ratios", "Table 1 shape")
WRITE_STEPS = ("cache_ratio", "figure9", "table1")


def compute_figures(bar: object = None) -> MooncakeFigures:
    """Recompute the three figures' frames from the bundled conversation and synthetic traces.

    ``bar``: a tqdm bar (:func:`kvlab.cli.files.step_bar`) advanced once per trace loaded
    and per figure computed, or ``None``.
    """
    bar = bar if bar is not None else step_bar(0, "", enabled=False)
    traces = {}
    for name in FIGURE_TRACES:
        bar.set_description(f"loading {name}")
        traces[name] = load_trace(name)
        bar.update()
    steps = iter(COMPUTE_STEPS)
    bar.set_description(next(steps))
    curves = mf.figure9_curves(traces)
    bar.update()
    bar.set_description(next(steps))
    cache_ratio = mf.cache_ratio_definitions(traces)
    bar.update()
    bar.set_description(next(steps))
    table1 = mf.table1_shape(traces["conversation"])
    bar.update()
    return MooncakeFigures(cache_ratio=cache_ratio, figure9=curves, shares=mf.share_at_3m_tokens(curves),
                           table1=table1)


def format_report(figs: MooncakeFigures) -> str:
    """The three tables as text, with which definition comes closest to Table 2."""
    lines = ["FAST'25 Table 2 'cache ratio' (unbounded LRU prefix cache; the paper does not define it)",
             f"{'definition':<32}{'conversation':>14}{'synthetic':>12}{'mean |error|':>14}"]
    wide = figs.cache_ratio.pivot(on="trace", index=["definition", "mean_abs_error"], values="ours")
    for row in wide.iter_rows(named=True):
        lines.append(f"{row['definition']:<32}{row['conversation']:>14.4f}{row['synthetic']:>12.4f}"
                     f"{row['mean_abs_error']:>14.4f}")
    lines.append(f"{'paper':<32}{mf.PAPER_CACHE_RATIO['conversation']:>14.2f}"
                 f"{mf.PAPER_CACHE_RATIO['synthetic']:>12.2f}")
    lines.append(f"closest: {figs.closest_definition()}\n")
    lines.append("FAST'25 Figure 9: share of the maximum hit ratio at 3 M tokens (LRU)")
    for row in figs.shares.iter_rows(named=True):
        lines.append(f"  {row['trace']:<14} ours {row['share_of_max']:.0%}   paper {row['paper']:.0%}")
    lines.append("\narXiv Table 1 shape on the conversation trace (token hit ratio; paper: its own trace)")
    lines.append(f"{'policy':<14}{'capacity (blocks)':>18}{'ours':>9}{'paper':>8}")
    for row in figs.table1.iter_rows(named=True):
        cap = "unbounded" if row["capacity_blocks"] is None else f"{row['capacity_blocks']:,}"
        lines.append(f"{row['policy']:<14}{cap:>18}{row['ours']:>9.4f}{row['paper']:>8.2f}")
    return "\n".join(lines)


def write_figures(figs: MooncakeFigures, out: str | Path, bar: object = None) -> list[Path]:
    """Write the three charts (PNG and SVG) and their tables (CSV) to ``out``.

    ``bar``: a tqdm bar advanced once per figure written, or ``None``.

    Returns:
        The paths written.
    """
    from kvlab.viz import cache_ratio_chart, figure9_chart, save_chart, table1_chart

    bar = bar if bar is not None else step_bar(0, "", enabled=False)
    out = Path(out)
    charts = {"cache_ratio": lambda: cache_ratio_chart(figs.cache_ratio),
              "figure9": lambda: figure9_chart(figs.figure9, figs.shares),
              "table1": lambda: table1_chart(figs.table1)}
    written = []
    for name in WRITE_STEPS:
        bar.set_description(f"writing {name} ({', '.join(FIGURE_FORMATS)}, csv)")
        written += save_chart(charts[name](), out, name, FIGURE_FORMATS)
        getattr(figs, name).write_csv(out / f"{name}.csv")
        written.append(out / f"{name}.csv")
        bar.update()
    return written


def run_figures(out: str | Path, *, progress: bool = False) -> MooncakeFigures:
    """``kvlab figures --out DIR``: compute, print the report, write the files.

    ``progress``: a progress bar on stderr, one step per trace loaded and per figure
    computed and written (``kvlab figures`` shows it).
    """
    with step_bar(len(FIGURE_TRACES) + len(COMPUTE_STEPS) + len(WRITE_STEPS), "figures", progress) as bar:
        figs = compute_figures(bar)
        written = write_figures(figs, out, bar)
    print(format_report(figs))
    print(f"\nwrote {len(written)} files to {out}/:", ", ".join(p.name for p in written))
    return figs
