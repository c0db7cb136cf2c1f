"""The README's Python examples run as written and print what their comments say."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


@pytest.fixture(scope="module")
def readme_run() -> tuple[dict, list[tuple[str, str]]]:
    """Every ```python block run in order, in one namespace, as a reader would: the namespace and
    each block's (source, printed output)."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    namespace: dict = {}
    printed = []
    for block in blocks:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(block, str(README), "exec"), namespace)  # noqa: S102 - our own README
        printed.append((block, out.getvalue()))
    return namespace, printed


def output_of(printed: list[tuple[str, str]], marker: str) -> list[str]:
    """The printed lines of the one block whose source holds ``marker``."""
    (out,) = [out for block, out in printed if marker in block]
    return out.splitlines()


def test_quickstart_prints_the_trace_and_the_headline_numbers(readme_run) -> None:
    namespace, printed = readme_run
    blocks = [block for block, _ in printed]
    assert len(blocks[0].strip().splitlines()) <= 12  # the first example stays short
    out = output_of(printed, "kvlab.replay(trace, capacity_blocks=10_000)")
    assert re.fullmatch(r"requests +12,031", out[3]) and re.fullmatch(r"distinct blocks +182,790", out[10])
    assert "block hits   61,046 / 288,500 = 0.2116" in out and "token hits   31,238,981 / 144,793,823 = 0.2157" in out
    assert namespace["curve"].height == 4
    assert namespace["panel"].result.summary.hit_blocks == 61_046  # the panel replays the same 10,000 blocks


def test_the_replay_panel_needs_only_import_kvlab() -> None:
    """Issue 14 item 22: the README's `kvlab.ui.replay_panel(trace)` after `import kvlab` alone, in a
    fresh interpreter; altair and ipywidgets load only then."""
    code = ("import sys, kvlab\nassert 'altair' not in sys.modules and 'ipywidgets' not in sys.modules\n"
            "panel = kvlab.ui.replay_panel(kvlab.load_trace('synthetic').head(50), capacity_blocks=100)\n"
            "print(type(panel).__name__, 'altair' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.split() == ["ReplayPanel", "True"]


def test_the_event_description_example_writes_and_replays(tmp_path: Path, capsys) -> None:
    """Issue 14 item 22: the JSON `kvlab events write --from-json` takes is shown, and does what the README says."""
    from kvlab.cli import main

    (example,) = re.findall(r"```json\n(.*?)```", README.read_text(), flags=re.S)
    desc, stream = tmp_path / "stream.json", tmp_path / "stream.kvev"
    desc.write_text(example)
    assert main(["events", "write", "--from-json", str(desc), str(stream)]) == 0
    capsys.readouterr()
    assert main(["events", "replay", str(stream), "--block-size", "4", "--json", "--strict"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["pods"] == {"pod-a": {"cpu": 2, "gpu": 1}}
    assert report["gaps"] == [{"pod": "pod-a", "data_parallel_rank": 0, "expected": 2, "got": 3}]


def test_policy_examples_print_the_policies_and_the_grid(readme_run) -> None:
    namespace, printed = readme_run
    out = output_of(printed, "print(sorted(POLICIES))")
    assert out[0] == str("arc belady fifo leaf_first_lru length_aware lfu lru s3fifo sieve".split())
    assert namespace["lru_curve"].height == 100 and namespace["lru_curve"]["token_hit_ratio"].is_sorted()
    grid = namespace["grid"]
    assert grid.height == 6 and set(grid["policy"]) == {"lru", "s3fifo", "belady"}
    assert sum("│ lru " in line or "│ s3fifo " in line or "│ belady " in line for line in out) == 6  # the table
    lru = namespace["lru_curve"].filter(namespace["lru_curve"]["capacity_blocks"] == 2_000)
    assert lru["hit_blocks"].to_list() == grid.filter(grid["policy"] == "lru")["hit_blocks"].to_list()[:1]


def test_tier_example_prints_the_tier_hits(readme_run) -> None:
    namespace, printed = readme_run
    assert output_of(printed, "replay_tiered(trace") == ["{'GPU': 15665, 'CPU': 45381}",
                                                         "64.0 MiB per 512-token block"]
    assert namespace["tiered"].summary.hit_blocks == 61046  # = one LRU of 10,000 blocks (README table)


def test_index_example_prints_applied_and_the_score(readme_run) -> None:
    namespace, printed = readme_run
    assert output_of(printed, "InMemoryIndex()") == ["applied", "{'pod-a': 2.0}"]
    assert len(namespace["keys"]) == 3 and namespace["index"].pod_tier_counts() == {"pod-a": {"gpu": 2}}


def test_blend_example_prints_the_matches_and_the_saved_fractions(readme_run) -> None:
    namespace, printed = readme_run
    out = output_of(printed, "replay_rag(docs")
    assert out == ["[BlendMatch(old_st=4, old_ed=8, cur_st=2, cur_ed=6, storage_key=12), "
                   "BlendMatch(old_st=0, old_ed=4, cur_st=6, cur_ed=10, storage_key=11)]", "0.398 0.856"]
    assert namespace["blend"].summary.requests == 40


def test_engine_example_prints_the_pool(readme_run) -> None:
    namespace, printed = readme_run
    assert [b.block_id for b in namespace["new_blocks"]] == [1, 2, 3, 4, 5] and namespace["hit_tokens"] == 0
    out = output_of(printed, "manager.block_pool.pretty()")
    # 18 tokens: 4 full blocks cached (1-4) and a partial one (5); freed in reverse after the untouched 6-10
    assert "in_use=0, free=10, cached=4" in out[0] and "free queue (head -> tail): 6 7 8 9 10 5 4 3 2 1" in out
    assert not namespace["run"].requests["rejected"].any()


def test_hashing_example_builds_keys_and_traces(readme_run) -> None:
    namespace, printed = readme_run
    assert output_of(printed, "RequestExtras(cache_salt") == []  # it prints nothing
    assert len(namespace["vllm_keys"]) == 6 and not set(namespace["vllm_keys"]) & set(namespace["llmd_keys"])
    assert not set(namespace["salted"]) & set(namespace["vllm_keys"])
    assert namespace["vllm_trace"].frame["block_keys"].list.len().to_list() == [6, 3]
    assert namespace["coarse"].block_size == 32


def test_cluster_sweep_example_prints_one_row_per_point(readme_run) -> None:
    namespace, printed = readme_run
    points = namespace["points"]
    assert points.select("num_workers", "router").rows() == [(1, "random"), (1, "least_loaded"), (2, "random"),
                                                             (2, "least_loaded")]
    assert points["completed_requests"].to_list() == [50] * 4
    assert sum("┆ random " in line or "┆ least_loaded " in line for line in output_of(printed, "cluster_sweep(")) == 4
