"""``kvlab figures``: the published Mooncake numbers recomputed on the bundled traces.

Writes to the output folder, each chart as PNG and SVG:

* ``cache_ratio.{png,svg}`` + ``cache_ratio.csv`` — FAST'25 Table 2 "cache ratio"
  (conversation 40 %, synthetic 66 %) against ours under each definition;
* ``figure9.{png,svg}`` + ``figure9.csv`` — FAST'25 Figure 9, LRU hit ratio vs capacity in
  tokens with the "x % of maximum at 3 M tokens" labels (paper 41 % / 46 %);
* ``table1.{png,svg}`` + ``table1.csv`` — arXiv 2407.00079 Table 1's shape (LRU / LFU /
  LengthAware) on the conversation trace beside the paper's values for its own trace;
* ``figure10.{png,svg}`` + ``figure10.csv`` (global/local ratios beside the paper's, marked as
  read from it) + ``figure10_runs.csv`` — FAST'25 Figure 10 on the timed cluster
  (:func:`kvlab.sim.cluster.mooncake_figures.figure10`, the setup's assumptions in the caption);
* ``figure5.{png,svg}`` + ``figure5.csv`` — FAST'25 §5.3's schedulers (Figure 5), mean TTFT
  beside the paper's.

The cluster runs (eight full-trace simulations, a few minutes) use one process per CPU.

and prints the three tables with the definition that comes closest to Table 2. ``kvlab figures``
shows its progress on stderr (a tqdm bar, one step per trace and per figure).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from kvlab.cli.files import step_bar
from kvlab.sim import mooncake_figures as mf
from kvlab.sim.cluster import mooncake_figures as cmf
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
    figure10_runs: pl.DataFrame
    figure10: pl.DataFrame
    figure5: pl.DataFrame

    def closest_definition(self) -> str:
        """The cache-ratio definition with the smallest mean absolute error to Table 2."""
        best = self.cache_ratio.group_by("definition", maintain_order=True).agg(pl.col("abs_error").mean())
        return best.sort("abs_error", maintain_order=True)["definition"][0]


#: Traces the figures are computed on (bundled names).
FIGURE_TRACES = ("conversation", "synthetic")
#: Steps of :func:`compute_figures` after the traces are loaded, then of :func:`write_figures`.
COMPUTE_STEPS = ("Figure 9 curves", "Table 2 cache ratios", "Table 1 shape", "Figure 10 (cluster)",
                 "Figure 5 schedulers (cluster)")
#: Figure 10's schedulers: the paper's ("higher prefix match ratios") and a cache-blind one, which
#: bracket the paper's ratios (docs/global_cache.md).
FIGURE10_ROUTERS = ("local_cache_aware", "load_balance")
WRITE_STEPS = ("cache_ratio", "figure9", "table1", "figure10", "figure5")


#: Where the cluster runs go (:func:`kvlab.sim.cluster.sweep`'s ``executor``; ``None``: one
#: process per CPU).
CLUSTER_EXECUTOR: object = None


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
    bar.set_description(next(steps))
    runs = cmf.figure10(traces, routers=FIGURE10_ROUTERS, executor=CLUSTER_EXECUTOR)
    bar.update()
    bar.set_description(next(steps))
    figure5 = cmf.scheduler_comparison(traces["conversation"], executor=CLUSTER_EXECUTOR).drop("wall_s").with_columns(
        paper_source=pl.when(pl.col("paper_ttft_mean_s").is_not_null()).then(pl.lit("read from FAST'25 Figure 5")))
    bar.update()
    return MooncakeFigures(cache_ratio=cache_ratio, figure9=curves, shares=mf.share_at_3m_tokens(curves),
                           table1=table1, figure10_runs=runs.drop("wall_s"), figure10=cmf.figure10_ratios(runs),
                           figure5=figure5)


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
    lines.append("\nFAST'25 Figure 10 on the timed cluster: global / local cache (assumptions: docs/global_cache.md)")
    lines.append(f"{'trace':<14}{'scheduler':<19}{'metric':<18}{'ours':>8}{'paper':>8}{'error':>9}")
    for row in figs.figure10.iter_rows(named=True):
        paper = "n/a" if row["paper"] is None else f"{row['paper']:.2f}"
        error = "" if row["error"] is None else f"{row['error']:+.0%}"
        lines.append(f"{row['trace']:<14}{row['router']:<19}{row['metric']:<18}{row['kvlab']:>8.2f}{paper:>8}"
                     f"{error:>9}")
    lines.append("tool&agent (paper x1.38, x0.74): trace not bundled")
    lines.append("\nFAST'25 §5.3 (Figure 5): mean TTFT per prefill scheduler, conversation trace")
    for row in figs.figure5.iter_rows(named=True):
        lines.append(f"  {row['router']:<18} ours {row['ttft_mean_s']:6.2f} s   "
                     f"paper {row['paper_ttft_mean_s']:6.2f} s")
    ttft = dict(zip(figs.figure5["router"], figs.figure5["ttft_mean_s"], strict=True))
    if {"conductor", "local_cache_aware"} <= ttft.keys():
        lines.append(f"  order as the paper's: {cmf.ordering_holds(figs.figure5)}; global/local "
                     f"{ttft['conductor'] / ttft['local_cache_aware']:.2f} (paper 0.86)")
    return "\n".join(lines)


def write_figures(figs: MooncakeFigures, out: str | Path, bar: object = None) -> list[Path]:
    """Write the three charts (PNG and SVG) and their tables (CSV) to ``out``.

    ``bar``: a tqdm bar advanced once per figure written, or ``None``.

    Returns:
        The paths written.
    """
    from kvlab.viz import cache_ratio_chart, figure9_chart, save_chart, table1_chart
    from kvlab.viz.global_cache_charts import figure10_chart, scheduler_chart

    bar = bar if bar is not None else step_bar(0, "", enabled=False)
    out = Path(out)
    charts = {"cache_ratio": lambda: cache_ratio_chart(figs.cache_ratio),
              "figure9": lambda: figure9_chart(figs.figure9, figs.shares),
              "table1": lambda: table1_chart(figs.table1),
              "figure10": lambda: figure10_chart(figs.figure10_runs, figs.figure10, cmf.MooncakeSetup().assumptions()),
              "figure5": lambda: scheduler_chart(figs.figure5, [
                  *cmf.MooncakeSetup.for_section53().assumptions(),
                  "of the paper's 16 nodes 8 prefill assumed (its P/D split is not given); paper: read from Fig. 5"])}
    written = []
    for name in WRITE_STEPS:
        bar.set_description(f"writing {name} ({', '.join(FIGURE_FORMATS)}, csv)")
        written += save_chart(charts[name](), out, name, FIGURE_FORMATS)
        getattr(figs, name).write_csv(out / f"{name}.csv")
        written.append(out / f"{name}.csv")
        if name == "figure10":
            figs.figure10_runs.write_csv(out / "figure10_runs.csv")
            written.append(out / "figure10_runs.csv")
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
