"""Import cost: CPU time of ``import kvlab``, ``kvlab --help`` and the heavy layers, each in fresh
interpreters, beside the libraries they may pull in (the anchor: ``import numpy`` alone).

Each statement runs in ``--repeats`` new subprocesses (after one warm-up run that writes the
bytecode caches); the child measures its own ``time.process_time()`` around the statement
(interpreter start-up excluded) and lists which of numpy, polars, numba, altair, ipywidgets
it left in ``sys.modules``. Best and median are reported, with the load average before and
after (the machine is shared). Targets: ``import kvlab`` ≤ 0.5 s of CPU (best), and neither
``import kvlab`` nor ``kvlab --help`` loads altair or ipywidgets.

Usage: ``python benchmarks/bench_import.py --out out/bench/bench_import.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from report import exit_unless_met, machine_info, write_report  # noqa: E402 - benchmarks/ is on sys.path

TARGET_IMPORT_KVLAB_S = 0.5
#: Libraries whose presence after a statement is reported.
WATCHED = ("numpy", "polars", "numba", "altair", "ipywidgets")
NOTEBOOK_LIBRARIES = ("altair", "ipywidgets")
HELP = ("import contextlib, io\nfrom kvlab.cli import main\n"
        "try:\n    with contextlib.redirect_stdout(io.StringIO()):\n        main(['--help'])\n"
        "except SystemExit:\n    pass")
#: (label, statement): the anchor first, then kvlab's entry points, then what they could pull in.
STATEMENTS = (
    ("import numpy (anchor)", "import numpy"),
    ("import kvlab", "import kvlab"),
    ("kvlab --help", HELP),
    ("import kvlab.core.validate", "import kvlab.core.validate"),
    ("import kvlab.core", "from kvlab.core import RunResult"),
    ("import kvlab.hashing", "import kvlab.hashing"),
    ("import kvlab.traces", "import kvlab.traces"),
    ("import kvlab.policies", "import kvlab.policies"),
    ("import kvlab.sim", "import kvlab.sim"),
    ("import kvlab.viz", "import kvlab.viz"),
    ("import kvlab.ui", "import kvlab.ui"),
    ("import polars", "import polars"),
    ("import numba", "import numba"),
    ("import altair", "import altair"),
    ("import ipywidgets", "import ipywidgets"),
)
_PROBE = """import time
_start = time.process_time()
{statement}
_cpu = time.process_time() - _start
import json, sys
print(json.dumps({{"cpu_s": _cpu, "loaded": [m for m in {watched!r} if m in sys.modules]}}))
"""


def run_once(statement: str) -> dict[str, object]:
    """One fresh interpreter running ``statement``: its CPU seconds and the watched modules it loaded."""
    probe = _PROBE.format(statement=statement, watched=WATCHED)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(statement: str, repeats: int) -> dict[str, object]:
    """Best and median CPU seconds of ``statement`` over ``repeats`` fresh interpreters (after a warm-up)."""
    run_once(statement)
    runs = [run_once(statement) for _ in range(repeats)]
    times = [run["cpu_s"] for run in runs]
    return {"best_cpu_s": min(times), "median_cpu_s": statistics.median(times), "runs": repeats,
            "loaded": runs[-1]["loaded"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench/bench_import.json"))
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    load_before = os.getloadavg()
    results = []
    for label, statement in STATEMENTS:
        row = {"statement": label, **measure(statement, args.repeats)}
        results.append(row)
        print(f"{label:<30}{row['best_cpu_s']:>8.3f} s best{row['median_cpu_s']:>8.3f} s median   "
              f"loads {', '.join(row['loaded']) or '-'}")
    load_after = os.getloadavg()
    by_label = {row["statement"]: row for row in results}
    kvlab_s, anchor_s = by_label["import kvlab"]["best_cpu_s"], by_label["import numpy (anchor)"]["best_cpu_s"]
    met = {
        f"import kvlab <= {TARGET_IMPORT_KVLAB_S} s": kvlab_s <= TARGET_IMPORT_KVLAB_S,
        "import kvlab and kvlab --help load no altair/ipywidgets": not any(
            set(by_label[label]["loaded"]) & set(NOTEBOOK_LIBRARIES) for label in ("import kvlab", "kvlab --help")),
    }
    print(f"import kvlab: {kvlab_s:.4f} s, {kvlab_s / anchor_s:.3f}x import numpy ({anchor_s:.3f} s)")
    write_report(args.out, {
        "benchmark": "bench_import", "machine": machine_info(), "repeats": args.repeats,
        "load_average_before": load_before, "load_average_after": load_after,
        "anchor": "import numpy", "import_kvlab_vs_anchor": kvlab_s / anchor_s,
        "target_import_kvlab_s": TARGET_IMPORT_KVLAB_S, "met": met, "results": results,
    })
    exit_unless_met(met, args.out)


if __name__ == "__main__":
    main()
