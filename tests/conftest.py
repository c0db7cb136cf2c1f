"""Shared factories and fixtures (vLLM-style: module-level helpers, seeded everything)."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from kvlab.paths import bundled_trace_path
from kvlab.traces import Trace, load_trace

pytest_plugins = ["redis_server"]  # redis_server, redis_index_factory (tests/redis_server.py)

# The session's compile cache (kvlab.core.jit) lives in this checkout's out/jit-cache unless
# KVLAB_CACHE_DIR is set: every process of the session (notebook kernels, subprocesses, spawned
# workers) inherits it and loads what another compiled, and runs of other checkouts sharing
# ~/.cache/kvlab/jit (each edit is a new digest folder; the oldest are pruned) cannot prune it
# mid-session. Set here, before any kernel is called.
os.environ.setdefault("KVLAB_CACHE_DIR", str(Path(__file__).resolve().parent.parent / "out" / "jit-cache"))

# CI runs derandomized (same examples every run); locally `HYPOTHESIS_PROFILE=dev` explores.
settings.register_profile("ci", derandomize=True, deadline=None, max_examples=150,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

_GOLDEN = 0x9E3779B97F4A7C15


def scramble(key: int) -> int:
    """Spread small ints over u64 so tests exercise interning of arbitrary keys."""
    return (key * _GOLDEN + 12345) % 2**64


def font_sizes(spec: object) -> list[float]:
    """Every ``*FontSize`` / ``fontSize`` value anywhere in a Vega-Lite spec dict (the charts'
    readability tests: issue 18 asks for fonts of at least 13 px)."""
    if isinstance(spec, dict):
        return [v for k, v in spec.items() if k.endswith("ontSize")] + [x for v in spec.values() for x in font_sizes(v)]
    if isinstance(spec, list):
        return [x for v in spec for x in font_sizes(v)]
    return []


def write_lines(tmp_path: Path, lines: list[str], name: str = "t.jsonl") -> Path:
    """A text file of ``lines`` (one per line, newline-terminated) in ``tmp_path``."""
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def reference_rechain(rows: list[list[int]]) -> list[list[int]]:
    """Plain-Python re-chaining: a new key per distinct (previous key, id) pair, numbered in order
    of first appearance (the reference for :func:`kvlab.traces.chain.rechain` and the loaders)."""
    table: dict[tuple[int, int], int] = {}
    out = []
    for ids in rows:
        parent, keys = -1, []
        for i in ids:
            parent = table.setdefault((parent, i), len(table))
            keys.append(parent)
        out.append(keys)
    return out


def make_trace(block_keys: list[list[int]], *, block_size: int = 4, input_tokens: list[int] | None = None,
               arrival_s: list[float] | None = None, source: str = "test") -> Trace:
    """A trace from key lists; full blocks unless ``input_tokens`` says otherwise."""
    n = len(block_keys)
    frame = pl.DataFrame({
        "request_id": list(range(n)),
        "arrival_s": arrival_s if arrival_s is not None else [float(i) for i in range(n)],
        "input_tokens": input_tokens if input_tokens is not None else [len(k) * block_size for k in block_keys],
        "output_tokens": [1] * n,
        "block_keys": pl.Series(block_keys, dtype=pl.List(pl.UInt64)),
    })
    return Trace(frame, block_size=block_size, source=source)


@st.composite
def chained_traces(draw: st.DrawFn, max_requests: int = 40, max_new_blocks: int = 8) -> Trace:
    """Random prefix-chained traces: each request extends a prefix of an earlier one."""
    block_size = draw(st.sampled_from([1, 4, 16]))
    n = draw(st.integers(1, max_requests))
    prompts: list[list[int]] = []
    next_key = 0
    inputs = []
    for _ in range(n):
        prefix: list[int] = []
        if prompts and draw(st.booleans()):
            base = draw(st.sampled_from(prompts))
            prefix = base[: draw(st.integers(0, len(base)))]
        extra = draw(st.integers(0, max_new_blocks))
        keys = prefix + [scramble(k) for k in range(next_key, next_key + extra)]
        next_key += extra
        prompts.append(keys)
        remainder = draw(st.integers(0, block_size - 1)) if keys else 0
        inputs.append(len(keys) * block_size - remainder)
    return make_trace(prompts, block_size=block_size, input_tokens=inputs)


@pytest.fixture(scope="session")
def conversation() -> Trace:
    """The bundled Mooncake conversation trace."""
    return load_trace(bundled_trace_path("conversation"))


@pytest.fixture(scope="session")
def synthetic() -> Trace:
    """The bundled Mooncake synthetic trace."""
    return load_trace(bundled_trace_path("synthetic"))
