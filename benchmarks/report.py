"""What every benchmark's JSON report shares: the machine it ran on, its load, and writing it.

Every benchmark imports this module before it measures anything, so the load average read at
import is the load *before* the run; ``write_report`` reads it again *after* and records both
under ``"load"`` with a ``busy`` flag (see ``load_record``): a busy run's wall times are not
evidence for or against a wall-time target (CPU-time targets still count).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numba
import numpy as np
import polars as pl

LOAD_BEFORE: tuple[float, float, float] = os.getloadavg()
"""1-, 5- and 15-minute load average when the benchmark started (this module's import)."""

BUSY_LOAD_PER_CPU = 0.5
"""A run is busy when the 1-minute load before or after exceeds this many runnable tasks per
CPU (1.0 on the 2-core reference machine): another job then shares the cores."""


def load_record(before: tuple[float, float, float] = LOAD_BEFORE,
                after: tuple[float, float, float] | None = None) -> dict[str, object]:
    """The load average before and after a run (``os.getloadavg()``: 1, 5, 15 minutes) and
    ``busy``: whether the 1-minute load before or after exceeded ``BUSY_LOAD_PER_CPU`` per CPU,
    with the threshold used. ``after`` defaults to the load now."""
    after = os.getloadavg() if after is None else after
    threshold = BUSY_LOAD_PER_CPU * (os.cpu_count() or 1)
    return {"before": list(before), "after": list(after), "busy_threshold_1min": threshold,
            "busy": max(before[0], after[0]) > threshold}


def machine_info() -> dict[str, object]:
    """Python, numba, numpy and polars versions, CPU count, platform of this run, and the
    1-, 5-, 15-minute load average when the benchmark started (``load_average_before``)."""
    return {"python": platform.python_version(), "numba": numba.__version__, "numpy": np.__version__,
            "polars": pl.__version__, "cpus": os.cpu_count(), "platform": platform.platform(),
            "load_average_before": list(LOAD_BEFORE)}


def write_report(out: Path, report: dict[str, object]) -> None:
    """Write ``report`` as indented JSON to ``out`` (its folder created), adding ``"load"``
    (``load_record()``: the load before the run, after it, and whether it was busy) unless the
    benchmark set it."""
    report = {**report, "load": report.get("load", load_record())}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")


def exit_unless_met(met: bool | dict[str, bool], out: Path) -> None:
    """Print which targets were met and where the report went; exit 1 when any was missed
    (``met``: one flag, or a flag per target)."""
    print(f"targets met: {met}  -> {out}")
    if not (all(met.values()) if isinstance(met, dict) else met):
        raise SystemExit(1)


def cpu_call(fn: Callable[[], object]) -> tuple[float, object]:
    """CPU seconds (``time.process_time``) of one call of ``fn``, and its value."""
    start = time.process_time()
    value = fn()
    return time.process_time() - start, value


def best_of(fn: Callable[[], object], repeats: int, clock: Callable[[], float] = time.perf_counter) -> float:
    """Best time of ``repeats`` calls of ``fn``, seconds: wall time, or ``clock``'s
    (``time.process_time``: CPU time, steadier on a shared machine)."""
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return min(times)


class PhaseTimer:
    """CPU time (``time.process_time``) spent in named methods of an object, per phase,
    accumulated until ``take()``: wraps ``obj.method`` with an instance attribute that times
    each call (the class is untouched). Used to split a widget's refresh into its phases.

    Example:
        >>> class Panel:
        ...     def compute(self): return sum(range(1000))
        >>> panel, timer = Panel(), PhaseTimer()
        >>> timer.wrap(panel, "compute", "simulate")
        >>> panel.compute()
        499500
        >>> sorted(timer.take())
        ['simulate']
    """

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}

    def wrap(self, obj: object, method: str, phase: str) -> None:
        """Time every call of ``obj.method`` as ``phase``."""
        inner = getattr(obj, method)

        def timed(*args: object, **kwargs: object) -> object:
            start = time.process_time()
            try:
                return inner(*args, **kwargs)
            finally:
                self.spent[phase] = self.spent.get(phase, 0.0) + time.process_time() - start

        setattr(obj, method, timed)

    def take(self) -> dict[str, float]:
        """The CPU seconds per phase since the last ``take()``, and reset."""
        spent, self.spent = self.spent, {}
        return spent

    def time_controls(self, steps: dict[str, tuple[object, list]], repeats: int,
                      first_visit_s: dict[str, float]) -> list[dict[str, object]]:
        """Move each widget control of ``steps`` (name -> (control, two values)) ``repeats`` times,
        alternating its two values, and return one row per control: median and worst CPU
        seconds per change, ``first_visit_s[name]``, the median of each phase in :data:`WIDGET_PHASES`
        (``chart_push`` is the rest of the change), and ``simulation_median_s``
        (``simulate`` + ``summary``). Wrap the panel's methods (:meth:`wrap`) first."""
        results = []
        for name, (control, values) in steps.items():
            times, phases = [], {phase: [] for phase in WIDGET_PHASES}
            for i in range(repeats):
                self.take()
                start = time.process_time()
                control.value = values[i % 2]
                total = time.process_time() - start
                spent = self.take()
                spent["chart_push"] = total - sum(spent.values())
                times.append(total)
                for phase in WIDGET_PHASES:
                    phases[phase].append(spent.get(phase, 0.0))
            simulation = [a + b for a, b in zip(phases["simulate"], phases["summary"], strict=True)]
            results.append({"control": name, "values": values, "median_s": statistics.median(times),
                            "worst_s": max(times), "first_visit_s": first_visit_s[name],
                            "simulation_median_s": statistics.median(simulation),
                            **{f"{phase}_median_s": statistics.median(v) for phase, v in phases.items()}})
        return results


#: The phases of a widget change :meth:`PhaseTimer.time_controls` reports.
WIDGET_PHASES = ("simulate", "summary", "chart_build", "chart_push")
