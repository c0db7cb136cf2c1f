"""`benchmarks/run_all.py` (issue 17 item 7): every benchmark runs, every target is reported,
exit 1 on any miss or crash. Fake bench scripts in a tmp folder, never the real benchmarks."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import run_all  # noqa: E402

import report  # noqa: E402

WRITES = """
import argparse, json
from pathlib import Path
parser = argparse.ArgumentParser()
parser.add_argument("--out", type=Path)
out = parser.parse_args().out
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps({report}))
raise SystemExit({code})
"""

LOAD = {"before": [0.25, 0.5, 0.5], "after": [1.5, 0.75, 0.5], "busy": True}

FAKES = {
    "bench_a_met.py": WRITES.format(report={"met": {"ratio_ge_10x": True}, "measured": {"ratio_ge_10x": 12.5},
                                            "load": {"before": [0.25, 0.5, 0.5], "after": [0.5, 0.5, 0.5],
                                                     "busy": False}}, code=0),
    "bench_b_missed.py": WRITES.format(report={"met": {"fast": True, "faster": False},
                                               "measured": {"fast": 0.03125}, "load": LOAD}, code=1),
    "bench_c_crash.py": "import sys\nprint('partial output')\nsys.stderr.write('Traceback: boom\\n')\n"
                        "raise ZeroDivisionError('kernel exploded')\n",
    "bench_d_flag.py": WRITES.format(report={"met": True}, code=0),
}


@pytest.fixture
def bench_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    for name, text in FAKES.items():
        (folder / name).write_text(text)
    (folder / "helper_not_a_bench.py").write_text("raise SystemExit(3)\n")
    return folder


def run(bench_dir: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, list[str]]:
    code = run_all.main(["--bench-dir", str(bench_dir), "--out-dir", str(bench_dir.parent / "out"), *extra])
    out = capsys.readouterr().out
    table = out[out.index("benchmark  "):].splitlines()
    return code, table


def test_every_benchmark_runs_and_every_target_is_in_the_table(bench_dir: Path, capsys) -> None:
    code, table = run(bench_dir, capsys)
    assert code == 1
    split = [line.split() for line in table[1:] if line and not line.startswith(" ")]
    assert split[:5] == [
        ["bench_a_met", "ratio_ge_10x", "met", "12.5", "0.25->0.5"],
        ["bench_b_missed", "fast", "met", "0.03125", "0.25->1.5", "busy"],
        ["bench_b_missed", "faster", "missed", "0.25->1.5", "busy"],
        ["bench_c_crash", "exit", "status", "1:", "no", "report", "written", "crashed"],
        ["bench_d_flag", "met", "met", "?"],
    ]
    assert split[5][:2] == ["4", "benchmarks:"]
    assert "3 targets met, 1 missed, 1 crashed" in table[-1]
    crash = table.index(next(line for line in table if line.startswith("bench_c_crash")))
    assert table[crash + 1] == "    stderr (tail):"
    assert table[crash + 2] == "      Traceback: boom"
    assert table[crash + 6] == "      ZeroDivisionError: kernel exploded"


def test_only_met_targets_exit_zero(bench_dir: Path, capsys) -> None:
    code, table = run(bench_dir, capsys, "--only", "a_met", "--only", "bench_d_flag.py")
    assert code == 0
    assert [line.split()[0] for line in table[1:3]] == ["bench_a_met", "bench_d_flag"]
    assert "2 benchmarks: 2 targets met, 0 missed, 0 crashed" in table[-1]


def test_only_a_miss_exits_one_and_a_stale_report_is_not_reused(bench_dir: Path, capsys) -> None:
    out = bench_dir.parent / "out"
    out.mkdir()
    (out / "bench_c_crash.json").write_text(json.dumps({"met": True}))  # a previous run's report
    code, table = run(bench_dir, capsys, "--only", "c_crash")
    assert code == 1
    assert table[1].split()[-1] == "crashed"
    assert not (out / "bench_c_crash.json").exists()
    code, _ = run(bench_dir, capsys, "--only", "b_missed")
    assert code == 1


def test_nonzero_exit_with_every_target_met_is_a_crash() -> None:
    rows = run_all.rows_from_report("bench_x", {"met": {"t": True}}, 2, "oops")
    assert [(r.target, r.status, r.measured) for r in rows] == [("t", "met", ""), ("exit status 2", "crashed", "oops")]
    assert [r.status for r in run_all.rows_from_report("bench_y", {"met": {}}, 0, "")] == ["report"]


def test_unknown_only_name_is_a_usage_error(bench_dir: Path) -> None:
    with pytest.raises(ValueError, match="only='nope': no benchmark bench_nope.py"):
        run_all.discover(bench_dir, ["nope"])


def test_write_report_records_load_before_and_after(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    report.write_report(out, {"met": True})
    load = json.loads(out.read_text())["load"]
    assert load["before"] == list(report.LOAD_BEFORE)
    assert len(load["after"]) == 3
    assert load["busy_threshold_1min"] == report.BUSY_LOAD_PER_CPU * report.os.cpu_count()
    busy = report.load_record(before=(0.2, 0, 0), after=(load["busy_threshold_1min"] + 0.1, 0, 0))
    idle = report.load_record(before=(0.2, 0, 0), after=(load["busy_threshold_1min"], 0, 0))
    assert (busy["busy"], idle["busy"]) == (True, False)
