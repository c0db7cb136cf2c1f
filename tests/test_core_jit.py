"""kvlab.core.jit: the on-disk kernel cache reloads in a fresh process and never runs a stale
kernel after an edit to a policy hook inlined into the replay driver (issue 17 item 5).

One end-to-end test compiles the real replay driver (cold, warm, after an edit). The cache
mechanism's other properties (off switch, unusable folders, corrupt files) do not depend on
which kernel is cached, so they run a one-line kernel in fresh processes: a fresh interpreter
reads the environment once, as a user's process does, without compiling the driver each time.
"""

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

#: A one-line kernel in a file of its own (numba caches only kernels defined in a file).
TINY_MODULE = """
from kvlab.core.jit import kernel_jit


@kernel_jit
def add_one(x):
    return x + 1
"""
#: Calls the one-line kernel in a fresh process; prints its value and cache stats.
TINY_SCRIPT = """
import json
import tiny_kernel
value = tiny_kernel.add_one(41)
stats = tiny_kernel.add_one.stats
print(json.dumps({"value": value, "cache_hits": sum(stats.cache_hits.values()),
                  "cache_misses": sum(stats.cache_misses.values())}))
"""


def run_child(script: str, env_extra: dict[str, str], pythonpath: Path, cwd: Path) -> dict:
    """Run ``script`` in a fresh interpreter (this environment without KVLAB_/NUMBA_ settings, plus
    ``env_extra``; ``pythonpath`` first on PYTHONPATH); its last printed line, parsed as JSON."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVLAB_", "NUMBA_"))}
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True,
                         cwd=cwd)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def tiny(tmp_path: Path):
    """``run(env_extra) -> {"value", "cache_hits", "cache_misses"}``: the one-line kernel in a fresh
    process; the module lives in ``tmp_path / "mod"``."""
    folder = tmp_path / "mod"
    folder.mkdir()
    (folder / "tiny_kernel.py").write_text(TINY_MODULE)

    def run(env_extra: dict[str, str]) -> dict:
        result = run_child(TINY_SCRIPT, env_extra, folder, tmp_path)
        assert result["value"] == 42
        return result

    run.folder = folder
    return run


def test_replay_driver_reloads_in_a_second_process_and_an_edited_hook_recompiles(tmp_path: Path) -> None:
    """End to end on a copy of the package: the FIFO replay driver compiles and is written to the
    cache, a second process loads it, and after an edit to FIFO's ``contains`` hook (inlined into
    the driver; same mtime) the next process compiles the edited hook instead of loading."""
    copy = tmp_path / "pkg"
    shutil.copytree(PACKAGE, copy / "kvlab", ignore=shutil.ignore_patterns("__pycache__"))
    env = {"KVLAB_CACHE_DIR": str(tmp_path / "cache")}
    first = run_child(SCRIPT, env, copy, copy)
    assert Path(first["package"]).resolve().is_relative_to(copy)
    assert (first["hits"], first["cache_hits"], first["cache_misses"]) == (HITS, 0, 1)
    assert list((tmp_path / "cache").rglob("kernel.replay_range-*.nbi"))
    second = run_child(SCRIPT, env, copy, copy)  # the unedited copy reloads
    assert (second["hits"], second["cache_hits"], second["cache_misses"]) == (HITS, 1, 0)

    fifo = copy / "kvlab" / "policies" / "fifo.py"
    source = fifo.read_text()
    hook = "    return state.resident[block_id]\n"
    assert source.count(hook) == 1, "FIFO's contains hook changed: update this test's edit"
    stat = fifo.stat()
    fifo.write_text(source.replace(hook, "    return False and state.resident[block_id]\n"))
    os.utime(fifo, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same mtime: numba's own stamp is blind
    edited = run_child(SCRIPT, env, copy, copy)
    assert (edited["hits"], edited["cache_hits"], edited["cache_misses"]) == ([0, 0, 0, 0, 0], 0, 1)


def test_second_process_loads_a_kernel_from_the_cache(tmp_path: Path, tiny) -> None:
    """The control for the tests below: a fresh process compiles and writes the kernel, the next
    one loads it (so "no hit" there means the cache was off or unusable, not that it never hits)."""
    env = {"KVLAB_CACHE_DIR": str(tmp_path / "cache")}
    first = tiny(env)
    assert (first["cache_hits"], first["cache_misses"]) == (0, 1)
    assert list((tmp_path / "cache").rglob("tiny_kernel.add_one-*.nbi"))
    second = tiny(env)
    assert (second["cache_hits"], second["cache_misses"]) == (1, 0)


def test_disabled_cache_writes_nothing(tmp_path: Path, tiny) -> None:
    env = {"KVLAB_CACHE_DIR": str(tmp_path / "cache"), "KVLAB_JIT_CACHE": "0"}
    for _ in range(2):
        assert tiny(env)["cache_hits"] == 0
    assert not (tmp_path / "cache").exists()
    assert not list(tiny.folder.rglob("*.nb[ic]"))  # nor numba's default beside the source


def test_unusable_cache_folder_degrades_to_compiling(tmp_path: Path, tiny) -> None:
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("a file where the cache root should be")
    for _ in range(2):
        assert tiny({"KVLAB_CACHE_DIR": str(blocker / "cache")})["cache_hits"] == 0
    assert not list(tiny.folder.rglob("*.nb[ic]"))  # no in-tree fallback (__pycache__ beside the source)


def test_unknown_user_cache_path_degrades_to_compiling(tiny) -> None:
    assert tiny({"KVLAB_CACHE_DIR": "~kvlab-no-such-user/cache"})["cache_hits"] == 0
    assert not list(tiny.folder.rglob("*.nb[ic]"))


@pytest.mark.parametrize("content", [b"", b"\x80not a pickle"])
def test_corrupt_cache_file_is_a_miss(tmp_path: Path, tiny, content: bytes) -> None:
    env = {"KVLAB_CACHE_DIR": str(tmp_path / "cache")}
    tiny(env)
    data_files = list((tmp_path / "cache").rglob("tiny_kernel.add_one-*.nbc"))
    assert data_files
    for path in data_files:
        path.write_bytes(content)
    run = tiny(env)
    assert (run["cache_hits"], run["cache_misses"]) == (0, 1)


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
