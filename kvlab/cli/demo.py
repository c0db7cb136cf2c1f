"""``kvlab demo``: the main job on the bundled Mooncake traces.

Replays the conversation and synthetic traces (FAST'25 release, 512-token blocks)
through an LRU prefix cache at 8 capacities from 1,000 to 100,000 blocks and
unbounded, prints the hit-ratio table, and writes to the output folder:

* ``<trace>_occupancy.{png,html}`` — occupancy and rolling hit ratio at 10,000 blocks;
* ``hit_ratio_vs_capacity.{png,html}`` — token hit ratio vs capacity, both traces;
* ``curve.parquet`` / ``curve.csv`` — the table behind the curve.

``kvlab demo`` shows its progress on stderr (a tqdm bar, one step per trace and figure).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from kvlab.cli.files import step_bar
from kvlab.paths import bundled_trace_path
from kvlab.sim import replay, sweep
from kvlab.traces import Trace, load_trace

#: Capacities of the demo curve, blocks (``None`` = unbounded).
DEMO_CAPACITIES: tuple[int | None, ...] = (1_000, 2_000, 5_000, 10_000, 20_000, 30_000, 50_000, 100_000, None)
DEMO_TRACES = ("conversation", "synthetic")
OCCUPANCY_CAPACITY_BLOCKS = 10_000


def demo_curve(traces: tuple[str, ...] = DEMO_TRACES,
               capacities: tuple[int | None, ...] = DEMO_CAPACITIES) -> pl.DataFrame:
    """LRU hit ratios of the bundled traces over ``capacities`` (a ``trace`` column added)."""
    return pl.concat([trace_curve(load_trace(bundled_trace_path(name)), name, capacities) for name in traces])


def trace_curve(trace: Trace, name: str, capacities: tuple[int | None, ...] = DEMO_CAPACITIES) -> pl.DataFrame:
    """One trace's rows of :func:`demo_curve`: the sweep frame with the ``trace`` column first."""
    return sweep(trace, capacities).with_columns(trace=pl.lit(name)).select("trace", pl.exclude("trace"))


def format_table(curve: pl.DataFrame) -> str:
    """The curve as a fixed-width text table (one row per trace and capacity)."""
    lines = [f"{'trace':<13}{'capacity (blocks)':>18}{'block hit':>11}{'token hit':>11}{'evictions':>12}"]
    for row in curve.iter_rows(named=True):
        cap = "unbounded" if row["capacity_blocks"] is None else f"{row['capacity_blocks']:,}"
        lines.append(f"{row['trace']:<13}{cap:>18}{row['block_hit_ratio']:>11.4f}"
                     f"{row['token_hit_ratio']:>11.4f}{row['evictions']:>12,}")
    return "\n".join(lines)


def run_demo(out: Path, *, progress: bool = False) -> pl.DataFrame:
    """Run the demo, print the table, write the figures and the table to ``out``.

    Args:
        out: the output folder (created).
        progress: a progress bar on stderr, one step per trace loaded and swept, per
            occupancy replay and per figure (``kvlab demo`` shows it).

    Returns:
        The curve frame (one row per trace and capacity).
    """
    from kvlab.viz import hit_ratio_curve, occupancy_chart, save_chart

    out = Path(out)
    written: list[Path] = []
    curves = []
    with step_bar(2 * len(DEMO_TRACES) + 1, "demo", progress) as bar:
        for name in DEMO_TRACES:
            bar.set_description(f"{name}: load, sweep {len(DEMO_CAPACITIES)} capacities")
            trace = load_trace(bundled_trace_path(name))
            curves.append(trace_curve(trace, name))
            bar.update()
            bar.set_description(f"{name}: occupancy at {OCCUPANCY_CAPACITY_BLOCKS:,} blocks")
            result = replay(trace, capacity_blocks=OCCUPANCY_CAPACITY_BLOCKS)
            chart = occupancy_chart(result, title=f"Mooncake {name} trace, LRU, "
                                                  f"{OCCUPANCY_CAPACITY_BLOCKS:,} blocks")
            written += save_chart(chart, out, f"{name}_occupancy")
            bar.update()
        bar.set_description("hit ratio vs capacity")
        curve = pl.concat(curves)
        written += save_chart(hit_ratio_curve(curve, color="trace", title="LRU token hit ratio vs capacity "
                                                                          "(flat lines: unbounded)"),
                              out, "hit_ratio_vs_capacity")
        curve.write_parquet(out / "curve.parquet")
        curve.write_csv(out / "curve.csv")
        written += [out / "curve.parquet", out / "curve.csv"]
        bar.update()
    print("LRU prefix cache on the Mooncake FAST'25 traces (512-token blocks, touch order head_most_recent,")
    print("no warm-up; token hit = hit tokens / input tokens)\n")
    print(format_table(curve))
    print(f"\nwrote {len(written)} files to {out}/:", ", ".join(p.name for p in written))
    return curve
