"""Replay panel latency: a control change to new chart data, split into simulation and chart.

The replay panel (``kvlab.ui.ReplayPanel``, LRU) is driven headlessly on each bundled trace:
each step sets one control (the capacity slider, the touch order, the warm-up) and the panel
re-runs ``kvlab.sim.replay``, the summary line and the occupancy chart. Every value a step
sets is visited once before the timings (compilation outside them). Reported per control: the
median and worst CPU time (``time.process_time``) over the repeats, and the median of each
phase (``report.PhaseTimer``): ``simulate`` (``compute``: the replay and its frames),
``summary`` (``_show_summary``), ``chart_build`` (``_chart_frames``: the chart's rows) and
``chart_push`` (the rest: ``LiveChart.show``, which packs the rows as JSON columns; the spec
is sent once). Target (issue 17, "Also"): the simulation side (simulate + summary) ≤ 30 ms
median per control; the chart side belongs to the browser issue (18) and is reported only.
The anchor is the same replay through the policy's reference class
(``kvlab.sim.replay_reference``), timed once, as a ratio. The design explorer's split is in
``bench_explorer.py``.

Usage: ``python benchmarks/bench_widgets.py --out out/bench/bench_widgets.json``
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from kvlab.paths import BUNDLED_TRACES
from kvlab.sim import replay_reference
from kvlab.traces import load_trace
from kvlab.ui import ReplayPanel
from report import WIDGET_PHASES as PHASES  # noqa: E402 - benchmarks/ is on sys.path
from report import PhaseTimer, exit_unless_met, machine_info, write_report

SIMULATION_BUDGET_S = 0.030
REPEATS = 7


def bench(name: str) -> dict:
    """Time each control of a replay panel on one bundled trace, split into phases."""
    trace = load_trace(name)
    panel = ReplayPanel(trace, capacity_blocks=10_000)
    stops = [v for _, v in panel.capacity.options]
    steps = {
        "capacity": (panel.capacity, [stops[len(stops) // 2 - 1], stops[len(stops) // 2]]),
        "touch order": (panel.touch_order, [v for _, v in panel.touch_order.options][::-1][:2]),
        "warm-up": (panel.warmup, [0.2, 0.0]),
    }
    first = {}
    for control_name, (control, values) in steps.items():  # compile outside the timings
        start = time.process_time()
        for value in values:
            control.value = value
        first[control_name] = time.process_time() - start
    timer = PhaseTimer()
    for method, phase in (("compute", "simulate"), ("_show_summary", "summary"), ("_chart_frames", "chart_build")):
        timer.wrap(panel, method, phase)
    results = timer.time_controls(steps, REPEATS, first)
    config = panel.config()
    start = time.process_time()
    replay_reference(trace, config)
    reference_s = time.process_time() - start
    slowest = max(r["simulation_median_s"] for r in results)
    for r in results:
        print(f"{name:<13} {r['control']:<12} median {1e3 * r['median_s']:6.1f} ms  worst {1e3 * r['worst_s']:6.1f} ms"
              f"  first visit {r['first_visit_s']:5.2f} s  |  "
              + "  ".join(f"{p} {1e3 * r[p + '_median_s']:5.1f}" for p in PHASES) + " ms")
    print(f"{name:<13} reference replay {reference_s:.2f} s ({reference_s / slowest:.0f}x the slowest control's "
          f"simulation median)")
    return {"trace": name, "block_refs": trace.block_refs, "config": str(config), "reference_s": reference_s,
            "ratio_reference_vs_slowest_simulation": reference_s / slowest, "results": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench/bench_widgets.json"))
    args = parser.parse_args()
    traces = [bench(name) for name in BUNDLED_TRACES]
    measured = {f"replay_panel_simulation_under_30ms_{t['trace']}": max(r["simulation_median_s"] for r in t["results"])
                for t in traces}
    met = {k: v <= SIMULATION_BUDGET_S for k, v in measured.items()}
    report = {"benchmark": "bench_widgets", "anchor": "the same replay through the reference class",
              "machine": machine_info(), "timing": "CPU time (time.process_time)",
              "simulation_budget_s": SIMULATION_BUDGET_S, "met": met, "measured": measured, "traces": traces}
    write_report(args.out, report)
    exit_unless_met(met, args.out)


if __name__ == "__main__":
    main()
