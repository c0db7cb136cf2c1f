"""What every benchmark's JSON report shares: the machine it ran on, and writing it."""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import numba
import numpy as np
import polars as pl


def machine_info() -> dict[str, object]:
    """Python, numba, numpy and polars versions, CPU count and platform of this run."""
    return {"python": platform.python_version(), "numba": numba.__version__, "numpy": np.__version__,
            "polars": pl.__version__, "cpus": os.cpu_count(), "platform": platform.platform()}


def write_report(out: Path, report: dict[str, object]) -> None:
    """Write ``report`` as indented JSON to ``out`` (its folder created)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")


def exit_unless_met(met: bool | dict[str, bool], out: Path) -> None:
    """Print which targets were met and where the report went; exit 1 when any was missed
    (``met``: one flag, or a flag per target)."""
    print(f"targets met: {met}  -> {out}")
    if not (all(met.values()) if isinstance(met, dict) else met):
        raise SystemExit(1)


def best_of(fn: Callable[[], object], repeats: int, clock: Callable[[], float] = time.perf_counter) -> float:
    """Best time of ``repeats`` calls of ``fn``, seconds: wall time, or ``clock``'s
    (``time.process_time``: CPU time, steadier on a shared machine)."""
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return min(times)
