"""sweep(): grids of policies × capacities, serial or in parallel, and `kvlab sweep`."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import polars as pl
import pytest

from kvlab.cli import main, parse_capacities
from kvlab.sim import replay, sweep

CAPS = [1_000, 10_000, None]


def test_every_executor_gives_the_same_frame(synthetic) -> None:
    serial = sweep(synthetic, CAPS, executor="serial")
    assert serial["capacity_blocks"].to_list() == CAPS
    assert serial["block_hit_ratio"].to_list() == [replay(synthetic, capacity_blocks=c).summary.block_hit_ratio
                                                  for c in CAPS]
    assert sweep(synthetic, CAPS).equals(serial)  # default: threads
    assert sweep(synthetic, CAPS, executor="processes").equals(serial)
    with ThreadPoolExecutor(3) as pool:
        assert sweep(synthetic, CAPS, executor=pool).equals(serial)


def test_sweep_options_and_errors(synthetic) -> None:
    frame = sweep(synthetic, [5_000], touch_order="tail_most_recent", warmup_fraction=0.5, mode="prefix",
                  hit_semantics="independent", executor="serial")
    row = frame.row(0, named=True)
    assert (row["touch_order"], row["warmup_fraction"]) == ("tail_most_recent", 0.5)
    with pytest.raises(ValueError, match="executor must be None, 'serial', 'processes'"):
        sweep(synthetic, [1, 2], executor="gpu")
    with pytest.raises(ValueError, match="unknown policy"):
        sweep(synthetic, [1], policies="nope")
    with pytest.raises(ValueError, match="trace must be a kvlab Trace"):
        sweep("synthetic", [1])


def test_parse_capacities() -> None:
    assert parse_capacities("1000:100000:3") == [1000, 10000, 100000]
    assert parse_capacities("1_000,2000,unbounded") == [1000, 2000, None]
    assert parse_capacities("1:3:10") == [1, 2, 3]  # rounded, duplicates dropped


def test_cli_sweep(capsys, tmp_path: Path) -> None:
    assert main(["sweep", "synthetic", "--capacities", "1000,unbounded", "--json", "--serial"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["capacity_blocks"] for r in rows] == [1000, None]
    assert round(rows[1]["block_hit_ratio"], 4) == 0.6396
    assert main(["sweep", "synthetic", "--capacities", "1000:10000:2", "--out", str(tmp_path)]) == 0
    assert "10,000" in capsys.readouterr().out
    assert {p.name for p in tmp_path.iterdir()} == {"sweep.parquet", "sweep.csv", "hit_ratio_vs_capacity.png",
                                                    "hit_ratio_vs_capacity.html"}
    assert pl.read_parquet(tmp_path / "sweep.parquet").height == 2
    assert main(["sweep", "synthetic", "--policies", "lru,nope"]) == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["sweep", "synthetic", "--capacities", "a:b:c"])


@pytest.mark.parametrize(("args", "message"), [
    (([],), "capacities_blocks is empty"),
    (([100], []), "policies is empty"),
    ((None,), "capacities_blocks must be a list"),
    ((100,), "capacities_blocks must be a list"),
    (([2**63],), r"capacity_blocks must be an integer in \[0, 2\*\*63\) or None, got 9223372036854775808"),
])
def test_sweep_rejects_empty_and_bad_lists(conversation, args, message) -> None:
    with pytest.raises(ValueError, match=message):
        sweep(conversation.head(10), *args)


def test_sweep_records_hit_semantics(conversation) -> None:
    frame = sweep(conversation.head(50), [10], hit_semantics="independent", executor="serial")
    assert frame["hit_semantics"].to_list() == ["independent"]
