"""kvlab.core.jit: the on-disk kernel cache reloads in a fresh process and never runs a stale
kernel after an edit to a policy hook inlined into the replay driver (issue 17 item 5)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kvlab
from kvlab.core.jit import kernel_jit

PACKAGE = Path(kvlab.__file__).resolve().parent

#: Replays a small trace with FIFO in a fresh process; prints the hits and the driver's cache stats.
SCRIPT = """
import json, sys
import polars as pl
import kvlab
from kvlab.sim import replay
from kvlab.sim.kernel import replay_range
from kvlab.traces import Trace
keys = [[1, 2, 3], [1, 2, 3], [1, 2, 4], [5, 6], [1, 2, 4]]
frame = pl.DataFrame({"request_id": list(range(5)), "arrival_s": [float(i) for i in range(5)],
                      "input_tokens": [4 * len(k) for k in keys], "output_tokens": [1] * 5,
                      "block_keys": pl.Series(keys, dtype=pl.List(pl.UInt64))})
result = replay(Trace(frame, block_size=4, source="test"), capacity_blocks=8, policy="fifo")
stats = replay_range.stats
print(json.dumps({"package": kvlab.__file__, "hits": result.requests["hit_blocks"].to_list(),
                  "cache_hits": sum(stats.cache_hits.values()),
                  "cache_misses": sum(stats.cache_misses.values())}))
"""
#: FIFO with capacity 8 never evicts here: every repeated block is a hit.
HITS = [0, 3, 2, 0, 3]


def run_replay(env_extra: dict[str, str], pythonpath: Path | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVLAB_", "NUMBA_"))}
    env.update(env_extra)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                         check=True, cwd=pythonpath or Path.cwd())
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_loads_the_driver_from_the_cache(tmp_path: Path) -> None:
    env = {"KVLAB_CACHE_DIR": str(tmp_path / "cache")}
    first = run_replay(env)
    assert (first["hits"], first["cache_hits"], first["cache_misses"]) == (HITS, 0, 1)
    assert list((tmp_path / "cache").rglob("kernel.replay_range-*.nbi"))
    second = run_replay(env)
    assert (second["hits"], second["cache_hits"], second["cache_misses"]) == (HITS, 1, 0)


def test_disabled_cache_writes_nothing(tmp_path: Path) -> None:
    env = {"KVLAB_CACHE_DIR": str(tmp_path / "cache"), "KVLAB_JIT_CACHE": "0"}
    for _ in range(2):
        run = run_replay(env)
        assert (run["hits"], run["cache_hits"]) == (HITS, 0)
    assert not (tmp_path / "cache").exists()


def test_unusable_cache_folder_degrades_to_compiling(tmp_path: Path) -> None:
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("a file where the cache root should be")
    for _ in range(2):
        run = run_replay({"KVLAB_CACHE_DIR": str(blocker / "cache")})
        assert (run["hits"], run["cache_hits"]) == (HITS, 0)
    assert not list((PACKAGE / "sim").glob("__pycache__/kernel.replay_range-*"))  # no in-tree fallback


def test_unknown_user_cache_path_degrades_to_compiling() -> None:
    run = run_replay({"KVLAB_CACHE_DIR": "~kvlab-no-such-user/cache"})
    assert (run["hits"], run["cache_hits"]) == (HITS, 0)


@pytest.mark.parametrize("content", [b"", b"\x80not a pickle"])
def test_corrupt_cache_file_is_a_miss(tmp_path: Path, content: bytes) -> None:
    env = {"KVLAB_CACHE_DIR": str(tmp_path / "cache")}
    run_replay(env)
    data_files = list((tmp_path / "cache").rglob("kernel.replay_range-*.nbc"))
    assert data_files
    for path in data_files:
        path.write_bytes(content)
    run = run_replay(env)
    assert (run["hits"], run["cache_hits"]) == (HITS, 0)


def test_edited_policy_hook_is_recompiled_not_loaded(tmp_path: Path) -> None:
    copy = tmp_path / "pkg"
    shutil.copytree(PACKAGE, copy / "kvlab", ignore=shutil.ignore_patterns("__pycache__"))
    env = {"KVLAB_CACHE_DIR": str(tmp_path / "cache")}
    first = run_replay(env, copy)
    assert Path(first["package"]).resolve().is_relative_to(copy)
    assert (first["hits"], first["cache_misses"]) == (HITS, 1)
    assert run_replay(env, copy)["cache_hits"] == 1  # the unedited copy reloads

    fifo = copy / "kvlab" / "policies" / "fifo.py"
    source = fifo.read_text()
    hook = "    return state.resident[block_id]\n"
    assert source.count(hook) == 1, "FIFO's contains hook changed: update this test's edit"
    stat = fifo.stat()
    fifo.write_text(source.replace(hook, "    return False and state.resident[block_id]\n"))
    os.utime(fifo, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same mtime: numba's own stamp is blind
    edited = run_replay(env, copy)
    assert (edited["hits"], edited["cache_hits"]) == ([0, 0, 0, 0, 0], 0)


def test_foreign_state_types_are_never_cached(tmp_path: Path) -> None:
    """A signature naming a class from outside kvlab (its code is not in the digest) compiles."""
    from typing import NamedTuple

    import numpy as np

    class Outside(NamedTuple):
        values: np.ndarray

    @kernel_jit
    def total(state):  # noqa: ANN001, ANN202
        return state.values.sum()

    assert total(Outside(np.arange(4))) == 6
    assert sum(total.stats.cache_hits.values()) == 0
    assert total.stats.cache_path is None or not list(Path(total.stats.cache_path).glob("*total*.nbi"))


def test_cache_option_is_rejected() -> None:
    with pytest.raises(ValueError, match="cache=True"):
        kernel_jit(cache=True)
