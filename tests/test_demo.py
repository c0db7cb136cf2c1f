"""`kvlab demo` (the `make demo` job): table, figures and curve on the bundled traces."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from kvlab.cli import main
from kvlab.cli.demo import DEMO_CAPACITIES


def test_demo_writes_figures_and_prints_table(tmp_path: Path, capsys) -> None:
    assert main(["demo", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    names = {p.name for p in tmp_path.iterdir()}
    for stem in ("conversation_occupancy", "synthetic_occupancy", "hit_ratio_vs_capacity"):
        assert {f"{stem}.png", f"{stem}.html"} <= names
    curve = pl.read_parquet(tmp_path / "curve.parquet")
    assert curve.height == 2 * len(DEMO_CAPACITIES)
    assert curve["capacity_blocks"].drop_nulls().min() == 1_000 and curve["capacity_blocks"].max() == 100_000
    # rows of issue #2's table, as printed
    assert "conversation             10,000     0.2116     0.2157" in out
    assert "synthetic             unbounded     0.6396     0.6512" in out
