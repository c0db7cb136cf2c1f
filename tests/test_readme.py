"""The README's Python example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_example_runs(capsys) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 7 and len(blocks[0].strip().splitlines()) <= 12
    namespace: dict = {}
    for block in blocks:  # run in order, in one namespace, as a reader would
        exec(compile(block, str(README), "exec"), namespace)  # noqa: S102 - our own README
    assert round(namespace["result"].summary.block_hit_ratio, 4) == 0.2116
    assert namespace["curve"].height == 4
    out = capsys.readouterr().out
    assert "0.2116" in out and "applied\n{'pod-a': 2.0}" in out and "\n0.398 0.856\n" in out
    assert [(m.old_st, m.cur_st, m.storage_key) for m in namespace["matcher"].match([100, 200, 5, 6, 7, 8, 1, 2, 3, 4])] \
        == [(4, 2, 12), (0, 6, 11)]
    assert len(namespace["vllm_keys"]) == 6 and not set(namespace["vllm_keys"]) & set(namespace["llmd_keys"])
    assert not set(namespace["salted"]) & set(namespace["vllm_keys"])
    assert namespace["vllm_trace"].frame["block_keys"].list.len().to_list() == [6, 3]
    assert namespace["coarse"].block_size == 32
    assert [b.block_id for b in namespace["new_blocks"]] == [1, 2, 3, 4, 5] and namespace["hit_tokens"] == 0
    assert namespace["run"].admitted.all()
    assert namespace["lru_curve"].height == 100 and namespace["lru_curve"]["token_hit_ratio"].is_sorted()
    grid = namespace["grid"]
    assert grid.height == 6 and set(grid["policy"]) == {"lru", "s3fifo", "belady"}
    lru = namespace["lru_curve"].filter(namespace["lru_curve"]["capacity_blocks"] == 2_000)
    assert lru["hit_blocks"].to_list() == grid.filter(grid["policy"] == "lru")["hit_blocks"].to_list()[:1]
    assert lru.height == 1
    assert namespace["tiered"].summary.tier_hit_blocks == {"GPU": 15665, "CPU": 45381}
    assert namespace["tiered"].summary.hit_blocks == 61046  # = one LRU of 10,000 blocks (README table)
    assert len(namespace["keys"]) == 3 and namespace["index"].pod_tier_counts() == {"pod-a": {"gpu": 2}}

