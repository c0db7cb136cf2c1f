"""The kvlab command (run in-process through main(argv))."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from kvlab.cli import main
from kvlab.sim import replay

REQUIRED_KEYS = {"driver", "source", "config", "requests", "block_refs", "hit_blocks", "block_hit_ratio",
                 "token_hit_ratio", "evictions"}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_replay_json(capsys) -> None:
    code, out, _ = run(capsys, "replay", "conversation", "--capacity-blocks", "10000", "--json")
    assert code == 0
    summary = json.loads(out)
    assert REQUIRED_KEYS <= summary.keys()
    assert summary["driver"] == "replay" and summary["source"].endswith("conversation_trace.jsonl")
    assert summary["config"]["capacity_blocks"] == 10_000 and summary["config"]["policy"] == "lru"
    assert round(summary["block_hit_ratio"], 4) == 0.2116


def test_replay_json_has_one_shape_in_every_mode(capsys, tmp_path: Path) -> None:
    shapes = {}
    for mode in ("prefix", "vllm"):
        code, out, _ = run(capsys, "replay", "synthetic", "--mode", mode, "--json", "--out", str(tmp_path / mode))
        printed = json.loads(out)
        assert code == 0 and printed == json.loads((tmp_path / mode / "summary.json").read_text())
        shapes[mode] = (list(printed), list(printed["config"]))
    assert shapes["prefix"] == shapes["vllm"]


def test_replay_text_with_warmup_and_touch_order(capsys) -> None:
    code, out, _ = run(capsys, "replay", "synthetic", "--capacity-blocks", "10_000", "--touch-order",
                       "tail_most_recent", "--warmup-fraction", "0.5")
    assert code == 0
    assert "1,997 measured (1,996 warm-up)" in out
    assert "= 0.5952" in out  # traces.md §5.3 block hit ratio


def test_replay_out_writes_frames_and_charts(capsys, tmp_path: Path, synthetic) -> None:
    code, _, _ = run(capsys, "replay", "synthetic", "--capacity-blocks", "5000", "--out", str(tmp_path))
    assert code == 0
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {"requests.parquet", "timeline.parquet", "summary.json", "occupancy.png", "occupancy.html"}
    assert pl.read_parquet(tmp_path / "requests.parquet").height == len(synthetic)
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["config"]["capacity_blocks"] == 5000 and written["hit_blocks"] == replay(
        synthetic, capacity_blocks=5000).summary.hit_blocks
    assert (tmp_path / "occupancy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_info(capsys) -> None:
    code, out, _ = run(capsys, "info", "synthetic", "--json")
    assert code == 0 and json.loads(out)["distinct_blocks"] == 43_924
    code, out, _ = run(capsys, "info", "conversation")
    assert "12,031" in out and "182,790" in out


def test_malformed_trace_reports_file_and_line(capsys, tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}\n'
                    '{"timestamp": 1, "input_length": 600, "output_length": 1, "hash_ids": [1]}\n')
    code, out, err = run(capsys, "replay", str(path))
    assert code == 2 and out == ""
    assert err.startswith(f"kvlab: error: {path}:2: 1 hash_ids but input_length=600")


def test_missing_trace(capsys) -> None:
    code, _, err = run(capsys, "info", "no-such-trace")
    assert code == 2
    assert err == ("kvlab: error: no trace file at no-such-trace "
                   "(bundled traces: azure-conv, claude-code, conversation, ragpulse, splitwise-conv, synthetic)\n")


@pytest.mark.parametrize(("argv", "message"), [
    (["replay", "synthetic", "--capacity-blocks", "-5"], "capacity must be in [0, 2**63) blocks, got -5"),
    (["replay", "synthetic", "--capacity-blocks", "lots"], "expected a number of blocks or 'unbounded'"),
    (["replay", "synthetic", "--warmup-fraction", "1.5"], "warm-up fraction must be in [0, 1), got 1.5"),
    (["replay", "synthetic", "--policy", "mru"], "invalid choice: 'mru'"),
    (["replay", "synthetic", "--window-requests", "0"], "expected an integer >= 1, got 0"),
    (["info", "synthetic", "--block-size", "0"], "expected an integer >= 1, got 0"),
])
def test_bad_arguments_exit_2(capsys, argv, message) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_out_must_be_a_folder(capsys, tmp_path: Path) -> None:
    existing = tmp_path / "file.txt"
    existing.write_text("x")
    for argv in (["replay", "synthetic", "--out", str(existing)], ["demo", "--out", str(existing)],
                 ["replay", "synthetic", "--out", ""]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"{existing} exists and is not a folder" in err and "the output folder path is empty" in err


def test_block_size_and_version(capsys, tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 20, "output_length": 1, "hash_ids": [1, 2]}\n')
    code, out, _ = run(capsys, "info", str(path), "--block-size", "16", "--json")
    assert code == 0 and json.loads(out)["block_size"] == 16
    code, _, err = run(capsys, "info", str(path))
    assert code == 2 and "needs ceil(20/512)=1" in err
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.startswith("kvlab 0.")


def test_replay_vllm_mode(capsys) -> None:
    code, out, _ = run(capsys, "replay", "synthetic", "--mode", "vllm", "--free-order", "classic", "--json")
    summary = json.loads(out)
    assert code == 0 and summary["config"]["mode"] == "vllm" and summary["config"]["free_order"] == "classic"
    assert summary["rejected_requests"] == 0
    code, out, _ = run(capsys, "replay", "synthetic", "--json")
    assert json.loads(out)["block_hit_ratio"] > summary["block_hit_ratio"]  # full blocks + last-token rule


def test_replay_omlx_mode(capsys) -> None:
    """oMLX with its pool at full size and no SSD hits as vLLM's pool; its paged SSD adds hits."""
    argv = ("replay", "synthetic", "--capacity-blocks", "300", "--json")
    vllm = json.loads(run(capsys, *argv, "--mode", "vllm")[1])
    plain = json.loads(run(capsys, *argv, "--mode", "omlx")[1])
    code, out, _ = run(capsys, *argv, "--mode", "omlx", "--ssd-capacity-blocks", "3000")
    ssd = json.loads(out)
    assert code == 0 and plain["driver"] == ssd["driver"] == "engine_omlx"
    assert ssd["config"]["ssd_only"] and ssd["config"]["ssd_capacity_blocks"] == 3000 and ssd["ssd_blocks"] == 3000
    assert plain["hit_blocks"] == vllm["hit_blocks"] and plain["rejected_requests"] == vllm["rejected_requests"]
    assert ssd["hit_blocks"] > plain["hit_blocks"] and ssd["restored_blocks"] > 0
    code, _, err = run(capsys, "replay", "synthetic", "--ssd-capacity-blocks", "30")
    assert code == 2 and "apply to mode 'omlx' only" in err


def test_out_under_a_file_is_rejected_before_work(tmp_path, capsys) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    for argv in (["sweep", "conversation", "--out", str(afile / "sub")], ["figures", "--out", str(afile / "sub")]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        assert "is a file, not a folder" in capsys.readouterr().err


def test_capacity_specs_name_the_form(capsys) -> None:
    for spec, message in (("1000:100000", "START:STOP:COUNT"), ("99999999999999999999", "[0, 2**63)")):
        with pytest.raises(SystemExit):
            main(["sweep", "conversation", "--capacities", spec])
        assert message in capsys.readouterr().err


def test_empty_policy_list_is_an_error(capsys) -> None:
    assert main(["sweep", "conversation", "--policies", ","]) == 2
    assert "policies is empty" in capsys.readouterr().err


def test_replay_with_tiers_json(capsys) -> None:
    code, out, _ = run(capsys, "replay", "conversation", "--tier", "GPU=2000", "--tier", "CPU=8000", "--json")
    assert code == 0
    summary = json.loads(out)
    assert summary["tier_hit_blocks"] == {"GPU": 15665, "CPU": 45381}  # = one LRU of 10,000 blocks
    assert summary["hit_blocks"] == 61046 and summary["config"]["write_policy"] == "write_back"


def test_replay_with_tiers_table_and_policies(capsys, tmp_path) -> None:
    code, out, _ = run(capsys, "replay", "synthetic", "--tier", "GPU=1000:fifo", "--tier", "NVMe=unbounded:none",
                       "--write-policy", "write_through", "--out", str(tmp_path / "t"))
    assert code == 0 and "write_through" in out and "NVMe" in out and "unbounded" in out
    assert pl.read_csv(tmp_path / "t" / "tier_counters.csv")["tier"].to_list() == ["GPU", "NVMe"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--tier", "GPU"], "expected NAME=CAPACITY_BLOCKS[:POLICY]"),
    (["--tier", "GPU=-3"], "capacity must be in [0, 2**63) blocks, got -3"),
    (["--tier", "GPU=10:mru"], "unknown policy 'mru'"),
    (["--tier", "GPU=10:belady"], "cannot run in a tier"),
    (["--tier", "GPU=10", "--tier", "GPU=20"], "tier names must be unique"),
    (["--tier", "GPU=10", "--capacity-blocks", "5"], "drop --capacity-blocks"),
    (["--tier", "GPU=5:"], "empty POLICY after ':'"),
    (["--write-policy", "write_through"], "apply to tiers: add --tier"),
    (["--write-policy", "write_back"], "apply to tiers: add --tier"),
    (["--tier", "GPU=10", "--free-order", "classic"], "drop --free-order"),
    (["--tier", "GPU=10", "--policy", "lru"], "drop --policy"),
])
def test_replay_with_bad_tiers(capsys, argv, message) -> None:
    try:
        code = main(["replay", "conversation", *argv])
    except SystemExit as exit_info:
        code = exit_info.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_rejections_appear_wherever_a_hit_ratio_does(capsys) -> None:
    """Issue 14 item 11: 2,066 of the 3,993 synthetic requests need more than a 20-block pool."""
    code, out, _ = run(capsys, "replay", "synthetic", "--mode", "vllm", "--capacity-blocks", "20")
    assert code == 0
    assert "rejected     2,066 of 3,993 requests never admitted (more blocks than the pool; counted as misses)" in out
    code, out, _ = run(capsys, "sweep", "synthetic", "--mode", "vllm", "--capacities", "20,100000", "--serial")
    header, *rows = out.splitlines()
    assert code == 0 and header.split() == ["policy", "capacity", "(blocks)", "block", "hit", "token", "hit",
                                            "rejected", "evictions"]
    assert [row.split()[4] for row in rows] == ["2,066", "0"]
    code, out, _ = run(capsys, "sweep", "synthetic", "--mode", "vllm", "--capacities", "20", "--json", "--serial")
    assert [row["rejected_requests"] for row in json.loads(out)] == [2_066]


def test_free_order_without_a_vllm_mode_is_refused(capsys) -> None:
    """Issue 14 item 14: as --write-policy without --tier, not silently ignored."""
    for argv in (["--free-order", "classic"], ["--free-order", "current", "--mode", "prefix"]):
        code, out, err = run(capsys, "replay", "synthetic", *argv)
        assert (code, out) == (2, "")
        assert err == "kvlab: error: --free-order applies to vLLM's free queue: add --mode vllm (or --mode omlx)\n"
    assert run(capsys, "replay", "synthetic", "--free-order", "classic", "--mode", "omlx", "--capacity-blocks",
               "300", "--json")[0] == 0


def every_option(parser, command: str = "kvlab"):
    """(command, option, help) of every option and positional argument of every subcommand."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from every_option(sub, f"{command} {name}")
        elif not isinstance(action, argparse._HelpAction):
            yield command, "/".join(action.option_strings) or action.dest, action.help


def test_every_option_is_described() -> None:
    """Issue 14 item 17: `kvlab sweep --help` left --touch-order, --warmup-fraction, --hit-semantics, --mode bare."""
    from kvlab.cli import build_parser

    options = list(every_option(build_parser()))
    assert ("kvlab sweep", "--hit-semantics") in {(c, o) for c, o, _ in options}
    assert [(command, option) for command, option, text in options if not text] == []


def kvlab_process(*argv: str, stdin: bytes = b"", **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvlab.cli", *argv], input=stdin, capture_output=True,
                          timeout=300, **kwargs)


def test_dash_reads_stdin(tmp_path: Path, synthetic) -> None:
    """Issue 14 item 17: `-` reads the trace (JSONL with a BOM, gzip, Parquet) or event input from stdin."""
    lines = [json.dumps({"timestamp": t, "input_length": 20, "output_length": 1, "hash_ids": [1, 2]}) for t in (0, 1)]
    text = ("\n".join(lines) + "\n").encode()
    for data in (b"\xef\xbb\xbf" + text, gzip.compress(text)):
        done = kvlab_process("info", "-", "--block-size", "16", "--json", stdin=data)
        assert (done.returncode, done.stderr) == (0, b"")
        stats = json.loads(done.stdout)
        assert (stats["source"], stats["requests"], stats["block_refs"]) == ("<stdin>", 2, 4)
    synthetic.head(10).write_parquet(tmp_path / "s.parquet")
    done = kvlab_process("replay", "-", "--json", stdin=(tmp_path / "s.parquet").read_bytes())
    assert done.returncode == 0 and json.loads(done.stdout)["source"] == synthetic.head(10).source
    bad = kvlab_process("info", "-", "--block-size", "16", stdin=text + b'{"timestamp": 2}\n')
    assert (bad.returncode, bad.stderr) == (2, b"kvlab: error: <stdin>:3: missing field 'input_length'\n")
    empty = kvlab_process("info", "-")
    assert (empty.returncode, empty.stderr) == (2, b"kvlab: error: TRACE '-': stdin is empty (nothing was piped in)\n")
    description = [{"pod": "p", "model": "m", "events": [{"type": "AllBlocksCleared"}]}]
    out = tmp_path / "s.kvev"
    done = kvlab_process("events", "write", "--from-json", "-", str(out),
                         stdin=b"\xef\xbb\xbf" + json.dumps(description).encode())
    assert (done.returncode, done.stdout) == (0, f"wrote 1 message to {out}\n".encode())
    done = kvlab_process("events", "replay", "-", "--strict", stdin=out.read_bytes())
    assert done.returncode == 0 and done.stdout.decode().splitlines()[0] == "<stdin>: 1 batch: 1 applied"
    broken = kvlab_process("events", "replay", "-", stdin=b"not an event file")
    assert broken.returncode == 2 and broken.stderr.startswith(b"kvlab: error: <stdin>")
    assert b"kvlab-stdin-" not in broken.stderr  # the temporary file is not named


def test_dash_with_a_terminal_on_stdin_is_refused(capsys, monkeypatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Terminal())
    code, out, err = run(capsys, "info", "-")
    assert (code, out) == (2, "")
    assert err == ("kvlab: error: TRACE '-' reads stdin, which is a terminal: pipe the input in (e.g. zcat "
                   "trace.jsonl.gz | kvlab info -) or give a file\n")


def test_an_event_description_with_a_byte_order_mark(capsys, tmp_path: Path) -> None:
    desc = tmp_path / "d.json"
    desc.write_bytes(b"\xef\xbb\xbf" + json.dumps([{"pod": "p", "model": "m", "events": []}]).encode())
    assert run(capsys, "events", "write", "--from-json", str(desc), str(tmp_path / "o.kvev"))[0] == 0


def test_an_unwritable_out_fails_before_the_work(capsys, tmp_path: Path, monkeypatch) -> None:
    """Issue 14 item 15: the replay ran, then writing failed. Checked first now (nothing replayed)."""
    import kvlab.sim

    def no_replay(*args, **kwargs):
        raise AssertionError("the work started before --out was checked")

    monkeypatch.setattr(kvlab.sim, "replay", no_replay)
    monkeypatch.setattr(kvlab.sim, "sweep", no_replay)
    if os.geteuid() == 0:  # root writes in any folder: a kernel file system refuses it
        target = Path("/sys/kvlab-test-out")
        if not Path("/sys").is_dir():
            pytest.skip("no /sys to refuse a folder to root")
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        target = locked / "out"
    for argv in (["replay", "synthetic"], ["sweep", "synthetic"]):
        code, out, err = run(capsys, *argv, "--out", str(target))
        assert (code, out) == (2, "")
        assert err.startswith(f"kvlab: error: cannot write to {target}: ") and len(err.splitlines()) == 1


@pytest.mark.parametrize("argv", [["info", "conversation"], ["replay", "synthetic", "--json"], ["--help"],
                                  ["sweep", "synthetic", "--capacities", "10,100", "--serial"]])
def test_a_closed_stdout_ends_quietly(argv: list[str]) -> None:
    """Issue 14 item 16: `kvlab ... | head` printed a BrokenPipeError traceback."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before kvlab writes: every write fails with EPIPE
    try:
        done = subprocess.run([sys.executable, "-m", "kvlab.cli", *argv], stdout=write, stderr=subprocess.PIPE,
                              timeout=300)
    finally:
        os.close(write)
    # as SIGPIPE would end it (argparse's --help ignores a failed write itself: 0)
    assert (done.returncode, done.stderr) == (0 if argv == ["--help"] else 141, b"")


def test_warmup_compiles_what_the_notebooks_use(capsys) -> None:
    """`kvlab warmup` (issue 18: a class starts warm): one replay per policy asked, the tiered
    driver for one to three LRU tiers, the miss-ratio curve; an unknown policy is refused."""
    from kvlab.cli.warmup import warmup_steps

    labels = [label for label, _ in warmup_steps(["lru", "arc"])]
    assert labels == ["replay, lru", "replay, arc", "tiers, lru", "tiers, lru+lru", "tiers, lru+lru+lru",
                      "miss-ratio curve"]
    with pytest.raises(ValueError, match="policy"):
        warmup_steps(["nope"])
    assert main(["warmup", "--policy", "lru"]) == 0
    assert "replay, lru: " in capsys.readouterr().out
