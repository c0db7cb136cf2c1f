"""`kvlab demo` (the `make demo` job): table, figures and curve on the bundled traces."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from kvlab.cli import main
from kvlab.cli.demo import DEMO_CAPACITIES, DEMO_TRACES


def parse_table(out: str) -> dict[tuple[str, int | None], tuple[float, float, int]]:
    """The printed table: (trace, capacity) → (block hit, token hit, evictions)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == ["trace"]) + 1
    rows = {}
    for line in lines[start:]:
        if not line.strip():
            break
        trace, cap, block, token, evictions = line.split()
        capacity = None if cap == "unbounded" else int(cap.replace(",", ""))
        rows[trace, capacity] = (float(block), float(token), int(evictions.replace(",", "")))
    return rows


def test_demo_writes_figures_and_prints_table(tmp_path: Path, capsys) -> None:
    assert main(["demo", "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    # issue 14 item 18: progress on stderr, a step per trace and per figure (it printed nothing for 70 s)
    steps = [step.split("  ")[0].rstrip(":") for step in err.replace("\r", "\n").splitlines() if step.strip()]
    for step in ("conversation: load, sweep 9 capacities", "conversation: occupancy at 10,000 blocks",
                 "synthetic: load, sweep 9 capacities", "synthetic: occupancy at 10,000 blocks",
                 "hit ratio vs capacity"):
        assert step in steps, step
    assert "5/5" in err  # all 5 steps done
    names = {p.name for p in tmp_path.iterdir()}
    for stem in ("conversation_occupancy", "synthetic_occupancy", "hit_ratio_vs_capacity"):
        assert {f"{stem}.png", f"{stem}.html"} <= names
    curve = pl.read_parquet(tmp_path / "curve.parquet")
    assert curve.height == 2 * len(DEMO_CAPACITIES)
    assert curve["capacity_blocks"].drop_nulls().min() == 1_000 and curve["capacity_blocks"].max() == 100_000
    table = parse_table(out)
    assert list(table) == [(t, c) for t in DEMO_TRACES for c in DEMO_CAPACITIES]  # every row, in order
    for row in curve.iter_rows(named=True):  # the table prints the curve it writes
        block, token, evictions = table[row["trace"], row["capacity_blocks"]]
        assert (block, token, evictions) == (pytest.approx(row["block_hit_ratio"], abs=5e-5),
                                             pytest.approx(row["token_hit_ratio"], abs=5e-5), row["evictions"])
    # rows of issue #2's table (README "What the replay means"; docs/specs/traces.md §5)
    assert table["conversation", 10_000][:2] == (0.2116, 0.2157)
    assert table["synthetic", None][:2] == (0.6396, 0.6512)
    assert table["synthetic", 10_000][:2] == (0.4239, 0.4318)
    assert table["conversation", None][:2] == (0.3664, 0.3736)


def test_figures_show_a_step_per_trace_and_figure(tmp_path: Path, capsys, monkeypatch, synthetic) -> None:
    """Issue 14 item 18: `kvlab figures` (79 s) printed nothing until the end. Here on a small trace."""
    import kvlab.cli.figures

    monkeypatch.setattr(kvlab.cli.figures, "load_trace", lambda name: synthetic.head(60))
    monkeypatch.setattr(kvlab.cli.figures, "CLUSTER_EXECUTOR", "serial")  # no process spawns here
    assert main(["figures", "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    steps = [step.split("  ")[0].rstrip(":") for step in err.replace("\r", "\n").splitlines() if step.strip()]
    expected = ["loading conversation", "loading synthetic", "Figure 9 curves", "Table 2 cache ratios",
                "Table 1 shape", "Figure 10 (cluster)", "Figure 5 schedulers (cluster)",
                "writing cache_ratio (png, svg, csv)", "writing figure9 (png, svg, csv)",
                "writing table1 (png, svg, csv)", "writing figure10 (png, svg, csv)", "writing figure5 (png, svg, csv)"]
    assert [step for i, step in enumerate(steps) if step in expected and step not in steps[:i]] == expected
    assert "12/12" in err and out.splitlines()[-1].startswith(f"wrote 16 files to {tmp_path}/:")
    figure10 = pl.read_csv(tmp_path / "figure10.csv")
    assert figure10.filter(pl.col("trace") == "synthetic")["paper"].to_list() == [2.36, 0.52] * 2  # two routers
    assert set(pl.read_csv(tmp_path / "figure5.csv")["router"]) == {"random", "load_balance", "local_cache_aware",
                                                                    "conductor"}
