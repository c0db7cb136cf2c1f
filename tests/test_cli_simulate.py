"""``kvlab simulate`` (in-process through main(argv)): the CLI runs exactly the library's simulation,
writes its frames, reads a TOML configuration that flags override, and refuses bad input with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from kvlab.cli import main
from kvlab.cli.simulate import parse_tier_size
from kvlab.sim.cluster import ClusterConfig, ClusterTier, get_router, simulate

#: Summary fields that measure the simulator itself (wall clock), not the simulated cluster.
WALL = {"wall_s", "simulated_requests_per_s"}
#: Llama-3.1-8B KV per 16-token block: 2 (K, V) × 32 layers × 8 KV heads × 128 dims × 2 bytes × 16 tokens.
LLAMA_8B_BLOCK_BYTES = 2 * 32 * 8 * 128 * 2 * 16


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def cluster_totals(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k not in WALL}


def test_llama_block_bytes_is_the_hand_computed_value() -> None:
    assert ClusterConfig(capacity_blocks=10).block_bytes == LLAMA_8B_BLOCK_BYTES == 2 * 2**20


def test_simulate_json_equals_the_library_run(capsys, tmp_path: Path, conversation) -> None:
    """--requests 30 with a CPU tier given in GiB and a Poisson rate: the same run as simulate()."""
    code, out, err = run(capsys, "simulate", "conversation", "--requests", "30", "--workers", "2",
                         "--capacity-blocks", "3000", "--tier", "CPU=64GiB", "--rate", "4", "--seed", "3",
                         "--slo-ttft", "2.5", "--json", "--out", str(tmp_path))
    assert code == 0
    assert "simulate" in err  # the progress bar, on stderr
    printed = json.loads(out)
    assert printed == json.loads((tmp_path / "summary.json").read_text())
    assert printed["driver"] == "simulate" and printed["source"].endswith("conversation_trace.jsonl[:30]")
    cfg = printed["config"]
    # 64 GiB / 2 MiB per block = 32,768 blocks, on the default host DRAM device
    assert cfg["tiers"] == [{"name": "CPU", "capacity_blocks": 64 * 2**30 // LLAMA_8B_BLOCK_BYTES,
                             "device": "host_dram_ddr5_4800_8ch", "policy": "lru"}] == [
        {"name": "CPU", "capacity_blocks": 32_768, "device": "host_dram_ddr5_4800_8ch", "policy": "lru"}]
    assert (cfg["num_workers"], cfg["capacity_blocks"], cfg["seed"], cfg["slo_ttft_s"], cfg["coalesce_decode"]) == (
        2, 3000, 3, 2.5, True)
    assert printed["requests"] == printed["completed_requests"] + printed["rejected_requests"] == 30
    config = ClusterConfig(num_workers=2, capacity_blocks=3000, tiers=(ClusterTier("CPU", 32_768),), seed=3,
                           slo_ttft_s=2.5)
    expected = simulate(conversation.head(30), config, rate=4.0)
    assert cluster_totals(printed) == cluster_totals(expected.summary.to_dict())
    for name in ("requests", "steps", "transfers", "timeline"):
        assert pl.read_parquet(tmp_path / f"{name}.parquet").equals(getattr(expected, name)), name


def test_simulate_text_output_and_no_coalesce(capsys, conversation) -> None:
    code, out, _ = run(capsys, "simulate", "conversation", "--requests", "20", "--capacity-blocks", "4000",
                       "--no-coalesce")
    assert code == 0
    lines = dict((*line.split(None, 1), "")[:2] for line in out.splitlines())
    assert lines["driver"] == "simulate" and "coalesce_decode=False" in lines["config"]
    assert lines["requests"] == "20"
    # coalescing is exact (C9): the same TTFTs as the coalesced run
    coalesced = simulate(conversation.head(20), capacity_blocks=4000)
    assert lines["ttft_mean_s"] == f"{coalesced.summary.ttft_mean_s:.4f}"


def test_simulate_config_file_and_flag_override(capsys, tmp_path: Path, conversation) -> None:
    toml = tmp_path / "cluster.toml"
    toml.write_text('num_workers = 3\nrouter = "round_robin"\ncapacity_blocks = 4000\n'
                    'enable_prefix_caching = false\nmax_num_seqs = 64\n'
                    '[[tiers]]\nname = "CPU"\ncapacity_blocks = 10000\npolicy = "fifo"\n')
    code, out, _ = run(capsys, "simulate", "conversation", "--requests", "12", "--config", str(toml),
                       "--workers", "2", "--json", "--out", str(tmp_path / "run"))
    assert code == 0
    cfg = json.loads(out)["config"]
    assert (cfg["num_workers"], cfg["capacity_blocks"], cfg["enable_prefix_caching"], cfg["max_num_seqs"]) == (
        2, 4000, False, 64)  # --workers beats the file's 3
    assert cfg["tiers"] == [{"name": "CPU", "capacity_blocks": 10_000, "device": "host_dram_ddr5_4800_8ch",
                             "policy": "fifo"}]
    assert cfg["router"]["type"] == "RoundRobin"
    workers = pl.read_parquet(tmp_path / "run" / "requests.parquet").sort("arrival_s", "request_id")["worker"]
    assert workers.to_list() == ["w0", "w1"] * 6  # round robin, in arrival order
    # prefix caching off: every admitted prompt computed whole; the 87,169-token one exceeds 4,000 × 16 and is rejected
    inputs = conversation.head(12).frame["input_tokens"]
    assert json.loads(out)["computed_prefill_tokens"] == inputs.filter(inputs <= 64_000).sum() == inputs.sum() - 87_169
    # --tier replaces the file's tiers
    code, out, _ = run(capsys, "simulate", "conversation", "--requests", "5", "--config", str(toml),
                       "--tier", "SSD=100:lru:nvme_gen4", "--json")
    assert code == 0 and json.loads(out)["config"]["tiers"] == [
        {"name": "SSD", "capacity_blocks": 100, "device": "nvme_gen4", "policy": "lru"}]


def test_simulate_echoes_the_router_it_ran(capsys) -> None:
    code, out, _ = run(capsys, "simulate", "conversation", "--requests", "4", "--capacity-blocks", "4000",
                       "--workers", "2", "--router", "scorer:dynamo_cost", "--json")
    assert code == 0 and "dynamo_cost" in json.dumps(json.loads(out)["config"]["router"])
    assert "round_robin" in json.dumps(ClusterConfig(router="round_robin", capacity_blocks=10).to_dict()["router"])


def test_scorer_router_runs(capsys) -> None:
    code, out, _ = run(capsys, "simulate", "conversation", "--requests", "6", "--capacity-blocks", "4000",
                       "--workers", "2", "--router", "scorer:longest_prefix", "--json")
    assert code == 0 and json.loads(out)["config"]["router"]["type"] == "ScorerRouter"
    assert type(get_router("scorer:longest_prefix")).__name__ == "ScorerRouter"


@pytest.mark.parametrize(("text", "expected"), [
    ("CPU=64GiB", ("CPU", 64 * 2**30, None, "lru", None)),
    ("CPU=64gb", ("CPU", 64 * 10**9, None, "lru", None)),
    ("CPU=1.5MiB", ("CPU", 3 * 2**19, None, "lru", None)),
    ("NVMe=5_000:fifo:nvme_gen4", ("NVMe", None, 5000, "fifo", "nvme_gen4")),
])
def test_parse_tier_size(text: str, expected: tuple) -> None:
    t = parse_tier_size(text)
    assert (t.name, t.size_bytes, t.blocks, t.policy, t.device) == expected


def test_bad_toml_files_exit_2(capsys, tmp_path: Path) -> None:
    cases = {
        'num_workers = 2\nnum_wrokers = 3\n': "unknown key 'num_wrokers'",
        'time_model = "roofline"\n': "unknown key 'time_model'",
        '[[tiers]]\nname = "CPU"\nsize = "4GiB"\n': "unknown key 'size' in tiers[0]",
        '[[tiers]]\nname = "CPU"\n': "tiers[0] lacks capacity_blocks",
        'tiers = 3\n': "tiers must be an array of tables",
        'num_workers = \n': "not valid TOML",
        'max_num_seqs = 0\n': "max_num_seqs must be an integer >= 1, got 0",
        'num_workers = "2"\n': "num_workers must be an integer >= 1, got '2'",
        '[[tiers]]\nname = "CPU"\ncapacity_blocks = "64GiB"\n': "tiers[0]: capacity_blocks",
    }
    for i, (text, message) in enumerate(cases.items()):
        path = tmp_path / f"c{i}.toml"
        path.write_text(text)
        code, _, err = run(capsys, "simulate", "conversation", "--requests", "3", "--config", str(path))
        assert code == 2 and err.startswith("kvlab: error: ") and message in err, (text, err)
        assert str(path) in err  # every problem of the file names it
    code, _, err = run(capsys, "simulate", "conversation", "--config", str(tmp_path / "missing.toml"))
    assert code == 2 and "missing.toml: no such file" in err
    code, _, err = run(capsys, "simulate", "conversation", "--config", str(tmp_path))
    assert code == 2 and err.startswith("kvlab: error: --config") and "cannot read it" in err, err


@pytest.mark.parametrize(("argv", "message"), [
    (["--router", "fastest"], "unknown router 'fastest'"),
    (["--router", "scorer:nope"], "unknown scorer 'nope'"),
    (["--rate", "-2"], "--rate must be a finite number > 0.0, got -2.0"),
    (["--time-scale", "0"], "--time-scale must be a finite number > 0.0, got 0.0"),
    (["--requests", "0"], "--requests must be an integer >= 1, got 0"),
    (["--workers", "0"], "num_workers must be an integer >= 1, got 0"),
    (["--tp", "0"], "tp must be an integer >= 1, got 0"),
    (["--model", "Llama-3.1-405B"], "raise tp or give capacity_blocks"),
    (["--roles", "decode,decode", "--workers", "2"], "a decode worker needs a prefill worker"),
    (["--gpu", "Z80"], "gpu"),
    (["--tier", "CPU=1KiB"], "tier 'CPU': 1,024 bytes hold no block of 2,097,152 bytes"),
    (["--tier", "CPU=10:nope"], "nope"),
    (["--slo-ttft", "-1"], "slo_ttft_s must be a finite number > 0.0"),
])
def test_bad_options_exit_2(capsys, argv: list[str], message: str) -> None:
    code, out, err = run(capsys, "simulate", "conversation", "--requests", "3", *argv)
    assert code == 2 and out == ""
    assert err.startswith("kvlab: error: ") and message in err, err


@pytest.mark.parametrize(("argv", "message"), [
    (["--tier", "CPU"], "expected NAME=SIZE[:POLICY[:DEVICE]]"),
    (["--tier", "CPU=64XB"], "size '64XB' is not a block count or a size with a unit"),
    (["--tier", "CPU=1.5"], "is not a block count"),
    (["--tier", "CPU=0GiB"], "size must be > 0"),
    (["--rate", "fast"], "expected a number, got 'fast'"),
    (["--workers", "two"], "expected an integer, got 'two'"),
])
def test_malformed_options_exit_2(capsys, argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as info:
        main(["simulate", "conversation", *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err
