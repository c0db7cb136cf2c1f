"""``kvlab figures``: the published Mooncake numbers recomputed on the bundled traces.

Writes to the output folder, each chart as PNG and SVG:

* ``cache_ratio.{png,svg}`` + ``cache_ratio.csv`` — FAST'25 Table 2 "cache ratio"
  (conversation 40 %, synthetic 66 %) against ours under each definition;
* ``figure9.{png,svg}`` + ``figure9.csv`` — FAST'25 Figure 9, LRU hit ratio vs capacity in
  tokens with the "x % of maximum at 3 M tokens" labels (paper 41 % / 46 %);
* ``table1.{png,svg}`` + ``table1.csv`` — arXiv 2407.00079 Table 1's shape (LRU / LFU /
  LengthAware) on the conversation trace beside the paper's values for its own trace.

and prints the three tables with the definition that comes closest to Table 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

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


def compute_figures() -> MooncakeFigures:
    """Recompute the three figures' frames from the bundled conversation and synthetic traces."""
    traces = {name: load_trace(name) for name in ("conversation", "synthetic")}
    curves = mf.figure9_curves(traces)
    return MooncakeFigures(cache_ratio=mf.cache_ratio_definitions(traces), figure9=curves,
                           shares=mf.share_at_3m_tokens(curves), table1=mf.table1_shape(traces["conversation"]))


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


def write_figures(figs: MooncakeFigures, out: str | Path) -> list[Path]:
    """Write the three charts (PNG and SVG) and their tables (CSV) to ``out``.

    Returns:
        The paths written.
    """
    from kvlab.viz import cache_ratio_chart, figure9_chart, save_chart, table1_chart

    out = Path(out)
    written = save_chart(cache_ratio_chart(figs.cache_ratio), out, "cache_ratio", FIGURE_FORMATS)
    written += save_chart(figure9_chart(figs.figure9, figs.shares), out, "figure9", FIGURE_FORMATS)
    written += save_chart(table1_chart(figs.table1), out, "table1", FIGURE_FORMATS)
    for name, frame in (("cache_ratio", figs.cache_ratio), ("figure9", figs.figure9), ("table1", figs.table1)):
        frame.write_csv(out / f"{name}.csv")
        written.append(out / f"{name}.csv")
    return written


def run_figures(out: str | Path) -> MooncakeFigures:
    """``kvlab figures --out DIR``: compute, print the report, write the files."""
    figs = compute_figures()
    print(format_report(figs))
    written = write_figures(figs, out)
    print(f"\nwrote {len(written)} files to {out}/:", ", ".join(p.name for p in written))
    return figs
