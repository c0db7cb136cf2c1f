"""Run every benchmark, keep going after a miss or a crash, and report every target at the end.

Each ``bench_*.py`` next to this file (discovered by glob, so a new benchmark joins
automatically) runs in a fresh interpreter as ``python bench_X.py --out OUT_DIR/bench_X.json``.
Its JSON's ``met`` (one flag, or a flag per target) gives one row per target; where the JSON
has ``measured`` (a mapping from target name to the measured value) the row shows the value.
The load average comes from the JSON's ``load`` (``report.write_report`` records it: before and
after, and ``busy``). A benchmark that exits non-zero without a fresh JSON, or whose JSON does
not parse, is a crash: its row shows the exit status and the tail of its stderr. A JSON with
no targets (``met`` empty or absent) is a report-only benchmark.

Exit status 1 when any target was missed or any benchmark crashed, 0 otherwise.

Usage: ``python benchmarks/run_all.py [--only NAME ...] [--out-dir out/bench]``
(``make bench`` runs them all).
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
STDERR_TAIL_LINES = 12


@dataclass(frozen=True)
class Row:
    """One line of the final table: a benchmark's target and its outcome.

    ``status`` is ``"met"``, ``"missed"``, ``"report"`` (no target set) or ``"crashed"``.
    """

    benchmark: str
    target: str
    status: str
    measured: str = ""
    load: str = ""


def discover(bench_dir: Path, only: list[str] | None = None) -> list[Path]:
    """The ``bench_*.py`` scripts of ``bench_dir``, sorted by name; with ``only``, those whose
    name (``bench_replay``, ``replay`` or ``bench_replay.py``) is listed. Raises ``ValueError``
    naming an ``only`` entry that matches no script."""
    scripts = sorted(bench_dir.glob("bench_*.py"))
    if not only:
        return scripts
    by_name = {s.stem: s for s in scripts}
    chosen = []
    for name in only:
        stem = name.removesuffix(".py")
        stem = stem if stem.startswith("bench_") else f"bench_{stem}"
        if stem not in by_name:
            raise ValueError(f"only={name!r}: no benchmark {stem}.py in {bench_dir} "
                             f"(have {', '.join(sorted(by_name))})")
        chosen.append(by_name[stem])
    return chosen


def _format_value(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _format_load(load: object) -> str:
    if not isinstance(load, dict):
        return "?"
    before, after = load.get("before") or ["?"], load.get("after") or ["?"]
    text = f"{_format_value(before[0])}->{_format_value(after[0])}"
    return text + (" busy" if load.get("busy") else "")


def rows_from_report(name: str, report: dict, returncode: int, stderr_tail: str) -> list[Row]:
    """The rows of one benchmark's JSON ``report`` (its exit status ``returncode``): one per
    target in ``met``; a non-zero exit with every target met is reported as a crash."""
    met = report.get("met", {})
    measured = report.get("measured", {})
    measured = measured if isinstance(measured, dict) else {"met": measured}
    load = _format_load(report.get("load"))
    flags = met if isinstance(met, dict) else {"met": met}
    rows = [Row(name, target, "met" if flag else "missed", _format_value(measured.get(target, "")), load)
            for target, flag in flags.items()]
    if not rows:
        rows.append(Row(name, "(no target set)", "report", "", load))
    if returncode != 0 and all(r.status != "missed" for r in rows):
        rows.append(Row(name, f"exit status {returncode}", "crashed", stderr_tail, load))
    return rows


def run_one(script: Path, out_dir: Path, python: str) -> tuple[list[Row], float]:
    """Run ``script`` in a fresh process with ``--out out_dir/<name>.json`` (stdout passed
    through, stderr passed through and its tail kept) and return its rows and wall seconds."""
    name = script.stem
    out = out_dir / f"{name}.json"
    out.unlink(missing_ok=True)  # a stale report must not pass for this run's
    tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
    start = time.perf_counter()
    proc = subprocess.Popen([python, str(script), "--out", str(out)], stderr=subprocess.PIPE, text=True)

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            sys.stderr.write(line)
            tail.append(line.rstrip("\n"))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    returncode = proc.wait()
    reader.join()
    wall = time.perf_counter() - start
    stderr_tail = "\n".join(tail)
    try:
        report = json.loads(out.read_text())
    except (OSError, ValueError) as exc:
        why = "no report written" if isinstance(exc, OSError) else f"report does not parse ({exc})"
        return [Row(name, f"exit status {returncode}: {why}", "crashed", stderr_tail, "")], wall
    return rows_from_report(name, report, returncode, stderr_tail), wall


def format_table(rows: list[Row]) -> str:
    """The final table: benchmark, target, status, measured value, 1-minute load before->after."""
    header = Row("benchmark", "target", "status", "measured", "load 1 min")
    cells = [header, *rows]
    widths = [max(len(getattr(r, field)) for r in cells if field != "measured" or r.status != "crashed")
              for field in ("benchmark", "target", "status", "measured", "load")]
    widths[3] = min(widths[3], 40)
    lines = []
    for r in cells:
        values = [r.benchmark, r.target, r.status, r.measured, r.load]
        if r.status == "crashed":  # the stderr tail goes on its own line, in full
            lines.append("  ".join(v.ljust(w) for v, w in zip(values[:3], widths[:3], strict=True)).rstrip())
            lines.append("    stderr (tail):" if r.measured else "    stderr: (empty)")
            lines.extend(f"      {line}" for line in r.measured.splitlines())
            continue
        lines.append("  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip())
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks, print the table, return the exit status (1 if any missed or crashed)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", metavar="NAME",
                        help="run only this benchmark (bench_replay, replay or bench_replay.py); repeatable")
    parser.add_argument("--out-dir", type=Path, default=Path("out/bench"), help="where the JSON reports go")
    parser.add_argument("--bench-dir", type=Path, default=HERE, help="where the bench_*.py scripts are")
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs each benchmark")
    args = parser.parse_args(argv)
    try:
        scripts = discover(args.bench_dir, args.only)
    except ValueError as exc:
        parser.error(str(exc))
    rows: list[Row] = []
    for script in scripts:
        print(f"=== {script.stem}", flush=True)
        script_rows, wall = run_one(script, args.out_dir, args.python)
        print(f"=== {script.stem}: {wall:.1f} s wall", flush=True)
        rows.extend(script_rows)
    missed = sum(r.status == "missed" for r in rows)
    crashed = sum(r.status == "crashed" for r in rows)
    met = sum(r.status == "met" for r in rows)
    print()
    print(format_table(rows))
    print(f"\n{len(scripts)} benchmarks: {met} targets met, {missed} missed, {crashed} crashed "
          f"(reports in {args.out_dir}; 'busy': the machine was loaded, so the run does not judge a wall-time "
          f"target)")
    return 1 if missed or crashed else 0


if __name__ == "__main__":
    raise SystemExit(main())
