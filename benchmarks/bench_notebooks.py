"""Notebooks that fit a class: wall and kernel CPU seconds of every notebook, cell by cell.

Each notebook of ``notebooks/`` runs top to bottom in a fresh kernel with nbclient (cwd: the
notebooks folder, as ``pytest --nbmake`` runs them), in full mode and in smoke mode
(``KVLAB_SMOKE=1``), one notebook at a time. Per run it records the wall seconds, the kernel's
CPU seconds (``psutil``: user + system of the kernel process and its children), every cell's
wall and CPU seconds (the slowest cells are printed: index among all cells, first line,
seconds) and the 1-, 5-, 15-minute load average before and after. The kernel imports kvlab
from this checkout (``PYTHONPATH``).

Compiling numba kernels is most of a first run (notebook 04 compiles the replay driver for nine
policies: minutes of CPU), and a class pays it once: kernels are cached on disk per digest of
kvlab's sources (:mod:`kvlab.core.jit`). The shared default cache (``~/.cache/kvlab/jit``)
keeps only the 4 most recently used digests, so on a machine where several checkouts run it is
mostly cold; this benchmark therefore uses its own cache folder (``--cache-dir``, default
``out/jit-cache-bench``) and records per run whether the folder for this digest held compiled
kernels before the run (``cache``: ``"warm"`` or ``"cold"``; warm means *some* kernels — a
notebook's own may still compile, so run each notebook once before judging). ``--cold`` gives
every run a fresh empty cache: the first run of a class.

Targets (issue 18): every notebook's full run ≤ 90 s and smoke run ≤ 30 s of wall time on the
2-core machine. Wall time is what a class waits for, so a run on a busy machine (``load.busy``)
does not judge a target; the CPU seconds beside it show how much of the wall was the kernel's.

Usage: ``python benchmarks/bench_notebooks.py [--only 04] [--mode smoke|full|both]
[--out out/bench/bench_notebooks.json]`` (``--only`` takes a notebook's name or its number
prefix and repeats).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import psutil
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's kvlab (cache_state's digest), like the kernels'

from report import exit_unless_met, machine_info, write_report  # noqa: E402 - benchmarks/ is on sys.path

NOTEBOOK_DIR = ROOT / "notebooks"
#: Wall-time targets per mode, seconds.
TARGETS_S = {"full": 90.0, "smoke": 30.0}
SLOWEST_CELLS = 5
CELL_TIMEOUT_S = 1800


def discover(only: list[str] | None, folder: Path = NOTEBOOK_DIR) -> list[Path]:
    """The notebooks of ``folder`` (default ``notebooks/``) sorted by name; with ``only``, those whose name or number
    prefix (``04``, ``04_eviction_policies`` or ``04_eviction_policies.ipynb``) is listed.
    Raises ``ValueError`` naming an ``only`` entry that matches no notebook."""
    paths = sorted(folder.glob("*.ipynb"))
    if not only:
        return paths
    chosen = []
    for name in only:
        stem = name.removesuffix(".ipynb")
        hits = [p for p in paths if p.stem == stem or p.stem.split("_", 1)[0] == stem]
        if not hits:
            raise ValueError(f"only={name!r}: no notebook {stem} in {folder} "
                             f"(have {', '.join(p.stem for p in paths)})")
        chosen.extend(hits)
    return chosen


def _kernel_cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` and its (waited-for) children; 0 if gone."""
    if pid is None:
        return 0.0
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return t.user + t.system + t.children_user + t.children_system


def cache_state(cache_dir: Path) -> str:
    """``"warm"`` when ``cache_dir`` holds compiled kernels for the current source digest of
    kvlab (this checkout's), else ``"cold"``."""
    from kvlab.core.jit import source_digest

    folder = cache_dir / source_digest()
    return "warm" if folder.is_dir() and any(folder.rglob("*.nbi")) else "cold"


def run_notebook(path: Path, mode: str, cache_dir: Path) -> dict[str, object]:
    """Execute ``path`` once in ``mode`` (``"full"`` or ``"smoke"``) in a fresh kernel, its
    compile cache in ``cache_dir``, and return wall and kernel CPU seconds in total and per
    code cell, the cache state, the load average before and after, and the error (``None``
    when every cell ran)."""
    if mode not in TARGETS_S:
        raise ValueError(f"mode={mode!r}: expected one of {sorted(TARGETS_S)}")
    nb = nbformat.read(path, as_version=4)
    env = dict(os.environ)
    env.pop("KVLAB_SMOKE", None)
    if mode == "smoke":
        env["KVLAB_SMOKE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["KVLAB_CACHE_DIR"] = str(cache_dir)
    cache = cache_state(cache_dir)
    cells: list[dict[str, object]] = []
    state: dict[str, object] = {"pid": None}

    def on_start(**_: object) -> None:
        if state["pid"] is None and client.km is not None:
            process = getattr(client.km.provisioner, "process", None)
            state["pid"] = getattr(process, "pid", None)
        state["wall"], state["cpu"] = time.perf_counter(), _kernel_cpu_s(state["pid"])

    def on_complete(cell: nbformat.NotebookNode, cell_index: int, **_: object) -> None:  # after the reply
        wall = time.perf_counter() - state["wall"]
        cpu = _kernel_cpu_s(state["pid"]) - state["cpu"]
        first = next((line for line in cell.source.splitlines() if line.strip()), "")
        cells.append({"index": cell_index, "first_line": first[:80], "wall_s": wall, "cpu_s": cpu})

    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}},
                            on_cell_execute=on_start, on_cell_executed=on_complete)
    load_before = os.getloadavg()
    error = None
    start, cpu_start = time.perf_counter(), time.process_time()
    saved_env = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)  # the kernel inherits this process's environment
    try:
        client.execute()
    except Exception as exc:  # a failing cell is reported, the other notebooks still run
        error = f"{type(exc).__name__}: {str(exc)[-600:]}"
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
    wall = time.perf_counter() - start
    load_after = os.getloadavg()
    kernel_cpu = sum(c["cpu_s"] for c in cells)
    slowest = sorted(cells, key=lambda c: c["wall_s"], reverse=True)[:SLOWEST_CELLS]
    return {"notebook": path.name, "mode": mode, "cache": cache, "wall_s": wall, "kernel_cpu_s": kernel_cpu,
            "client_cpu_s": time.process_time() - cpu_start, "target_s": TARGETS_S[mode],
            "met": error is None and wall <= TARGETS_S[mode], "error": error,
            "load_before": list(load_before), "load_after": list(load_after),
            "slowest_cells": slowest, "cells": cells}


def print_run(run: dict[str, object]) -> None:
    """One summary line for ``run`` and a line per slowest cell."""
    status = "met" if run["met"] else ("ERROR" if run["error"] else "missed")
    print(f"{run['notebook']:<32}{run['mode']:<6}{run['cache']:<5}{run['wall_s']:>8.1f} s wall"
          f"{run['kernel_cpu_s']:>8.1f} s cpu  target {run['target_s']:.0f} s {status}"
          f"  load {run['load_before'][0]:.2f}->{run['load_after'][0]:.2f}",
          flush=True)
    for cell in run["slowest_cells"]:
        print(f"    cell {cell['index']:>2} {cell['wall_s']:>7.2f} s ({cell['cpu_s']:>6.2f} cpu)  {cell['first_line']}")
    if run["error"]:
        print(f"    error: {run['error']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "out/bench/bench_notebooks.json")
    parser.add_argument("--only", action="append", metavar="NAME",
                        help="run only this notebook (name or number prefix, e.g. 04); repeatable")
    parser.add_argument("--mode", choices=("smoke", "full", "both"), default="both")
    parser.add_argument("--notebook-dir", type=Path, default=NOTEBOOK_DIR,
                        help="run the notebooks of this folder (e.g. a copy of an older checkout's)")
    parser.add_argument("--cache-dir", type=Path, default=ROOT / "out/jit-cache-bench",
                        help="the kernels' compile cache (KVLAB_CACHE_DIR) of the runs")
    parser.add_argument("--cold", action="store_true", help="every run starts from an empty compile cache")
    args = parser.parse_args()
    # SIGTERM (timeout, kill) unwinds like ^C, so nbclient shuts the running kernel down
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        paths = discover(args.only, args.notebook_dir)
    except ValueError as exc:
        parser.error(str(exc))
    modes = ("smoke", "full") if args.mode == "both" else (args.mode,)
    runs = []
    for path in paths:
        for mode in modes:
            if args.cold:
                with tempfile.TemporaryDirectory(prefix="kvlab-jit-cold-") as cold:
                    run = run_notebook(path, mode, Path(cold))
            else:
                run = run_notebook(path, mode, args.cache_dir)
            print_run(run)
            runs.append(run)
    met = {f"{run['notebook']} {run['mode']} <= {run['target_s']:.0f} s": bool(run["met"]) for run in runs}
    measured = {f"{run['notebook']} {run['mode']} <= {run['target_s']:.0f} s": round(run["wall_s"], 1)
                for run in runs}
    write_report(args.out, {
        "benchmark": "bench_notebooks", "machine": machine_info(), "python": sys.executable,
        "notebook_dir": str(args.notebook_dir), "compile_cache": "fresh per run" if args.cold else str(args.cache_dir),
        "targets_s": TARGETS_S, "met": met, "measured": measured, "runs": runs,
    })
    exit_unless_met(met, args.out)


if __name__ == "__main__":
    main()
