"""kvlab formats / info / convert and the trace options every command shares."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvlab.cli import main
from kvlab.cli.traces import parse_key_values
from kvlab.traces import FORMATS, load_trace


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_formats_lists_every_format_in_detection_order(capsys) -> None:
    code, out, _ = run(capsys, "formats")
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == list(FORMATS)


def test_info_prints_format_sessions_and_reused_blocks(capsys) -> None:
    code, out, _ = run(capsys, "info", "conversation")
    assert code == 0
    assert "format                      mooncake (FAST'25 conversation trace)" in out
    # specs/traces.md §3: 182,790 distinct ids, 138,646 used exactly once
    assert "reused blocks               44,144 of 182,790 (24.2%) in more than one request" in out
    code, out, _ = run(capsys, "info", "synthetic", "--json")
    stats = json.loads(out)
    assert (stats["reused_blocks"], stats["sessions"], stats["provenance"]["format"]) == (43_924 - 25_673, None,
                                                                                          "mooncake")


def test_convert_round_trips_with_provenance(capsys, tmp_path: Path) -> None:
    out_path = tmp_path / "s.parquet"
    code, out, _ = run(capsys, "convert", "synthetic", str(out_path), "--block-size", "512")
    assert code == 0 and out.startswith(f"wrote {out_path}: 3,993 requests, 512-token blocks, format mooncake")
    original = load_trace("synthetic")
    back = load_trace(out_path)
    assert back.same_as(original)
    assert back.provenance["options"] == {"block_size": 512}
    code, out, _ = run(capsys, "info", str(out_path))
    assert "parquet (converted from mooncake (FAST'25 synthetic trace))" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["convert", "synthetic", "x.csv"], "must end in .parquet"),
    (["convert", "synthetic", "/no/such/folder/x.parquet"], "folder /no/such/folder does not exist"),
    (["info", "synthetic", "--trace-option", "rate_per_s=2"], "option(s) rate_per_s do not apply to mooncake"),
    (["info", "synthetic", "--format", "parquet"], "not a readable Parquet file"),
])
def test_bad_trace_options_exit_2(capsys, argv, message) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and message in err


def test_convert_refuses_to_overwrite_its_input(capsys, tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    load_trace("synthetic").head(3).write_parquet(path)
    code, _, err = run(capsys, "convert", str(path), str(path))
    assert code == 2 and "is the input" in err


def test_unknown_format_is_an_argument_error(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["info", "synthetic", "--format", "csv"])
    assert "unknown trace format 'csv'; known: parquet" in capsys.readouterr().err


def test_key_values() -> None:
    assert parse_key_values("a=1, b=0.5,c=x,") == {"a": 1, "b": 0.5, "c": "x"}
    with pytest.raises(Exception, match="expected KEY=VALUE"):
        parse_key_values("a")


def test_loader_options_reach_the_loader(capsys) -> None:
    sample = str(Path(__file__).parent / "data" / "servegen_trace_c_head.jsonl")
    code, _, err = run(capsys, "info", sample)
    assert code == 2 and "pass rate_per_s=" in err and "--trace-option rate_per_s=2.0" in err
    code, out, _ = run(capsys, "info", sample, "--trace-option", "rate_per_s=2.0,seed=3", "--json")
    stats = json.loads(out)
    assert code == 0 and stats["format"] == "servegen" and stats["requests"] == 50
    assert stats["provenance"]["options"]["rate_per_s"] == 2.0 and stats["provenance"]["options"]["seed"] == 3


def test_block_size_as_a_trace_option_or_a_flag(capsys, tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 40, "output_length": 1, "hash_ids": [1, 2, 3]}\n')
    for argv in (["--block-size", "16"], ["--trace-option", "block_size=16"],
                 ["--block-size", "16", "--trace-option", "block_size=16"]):
        code, out, _ = run(capsys, "info", str(path), "--json", *argv)
        assert code == 0 and json.loads(out)["block_size"] == 16
    code, _, err = run(capsys, "info", str(path), "--block-size", "16", "--trace-option", "block_size=32")
    assert code == 2 and "--block-size 16 and --trace-option block_size=32 disagree" in err


def test_detection_explains_empty_folders_and_pretty_printed_json(capsys, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    code, _, err = run(capsys, "info", str(tmp_path / "empty"))
    assert code == 2 and err.endswith("empty: an empty folder: no trace files in it\n")
    pretty = tmp_path / "p.json"
    pretty.write_text(json.dumps([{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [1]}], indent=2))
    code, _, err = run(capsys, "info", str(pretty))
    assert code == 2 and "mooncake (" in err
    assert "looks like one JSON document over several lines (pretty-printed), not one JSON object per line" in err


def test_python_misuse_is_a_value_error() -> None:
    for bad in ({"path": None}, {"path": 42}, {"path": "synthetic", "format": FORMATS["mooncake"]}):
        with pytest.raises(ValueError, match="must be a"):
            load_trace(**bad)


def test_synthesize_prefix_refuses_real_keys_unless_asked(capsys) -> None:
    code, _, err = run(capsys, "replay", "synthetic", "--synthesize-prefix")
    assert code == 2 and "has block keys of its own" in err and "replace_keys=True" in err
    code, out, _ = run(capsys, "replay", "synthetic", "--synthesize-prefix", "replace_keys=true,num_prefixes=3",
                       "--json")
    assert code == 0 and "synthesize_prefix(shared_prefix_tokens=512, num_prefixes=3" in json.loads(out)["source"]
