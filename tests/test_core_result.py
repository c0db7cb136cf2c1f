"""The result contract: every driver returns a kvlab.core.RunResult whose core columns are right.

Adding a driver is one entry in ``DRIVERS``: how to run it on a trace with token ids, and the
tokens its blocks hold (for ``hit_tokens = min(hit_blocks * block_size, input_tokens)``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.blend import replay_rag, replay_segments
from kvlab.core import (
    CORE_REQUEST_COLUMNS,
    SINGLE_TIER,
    RunResult,
    RunSummary,
    check_result,
    timeline_frame,
    to_jsonable,
)
from kvlab.engines import replay_requests
from kvlab.hashing import sim
from kvlab.index import route_requests
from kvlab.sim import replay, replay_reference
from kvlab.tiers import replay_tiered
from kvlab.traces import Trace

BLOCK = 4  # tokens per block of the contract traces

#: driver name → (run it on a trace, the tokens one of its blocks holds).
DRIVERS: dict[str, tuple[Callable[[Trace], RunResult], Callable[[RunResult], int]]] = {
    "replay-prefix": (lambda t: replay(t, capacity_blocks=20), lambda r: BLOCK),
    "replay-vllm": (lambda t: replay(t, capacity_blocks=12, mode="vllm"), lambda r: BLOCK),
    "replay-omlx": (lambda t: replay(t, capacity_blocks=12, mode="omlx", ssd_only=True, ssd_capacity_blocks=30),
                    lambda r: BLOCK),
    "replay_requests": (lambda t: replay_requests(t, capacity_blocks=12), lambda r: BLOCK),
    "replay_reference": (lambda t: replay_reference(t, policy="s3fifo", capacity_blocks=20), lambda r: BLOCK),
    "replay_rag": (lambda t: replay_rag(t, chunk_size=8, capacity_chunks=6, min_blend_tokens=8),
                   lambda r: r.config.chunk_size),
    "replay_segments": (lambda t: replay_segments(t, warmup_fraction=0.2), lambda r: BLOCK),
    "route_requests": (lambda t: route_requests(t, capacity_blocks=12, block_size=BLOCK),
                       lambda r: r.config.block_size),
    "replay_tiered": (lambda t: replay_tiered(t, [("GPU", 6), ("CPU", 10, "s3fifo"), ("NVMe", None)]),
                      lambda r: BLOCK),
    "replay_tiered-reference": (lambda t: replay_tiered(t, [("GPU", 6), ("CPU", 10, "arc")], engine="reference",
                                                        write_policy="write_through"),
                                lambda r: BLOCK),
}


def token_trace(seed: int, num_requests: int = 25) -> Trace:
    """Prompts that extend a prefix of an earlier one (shared prefixes, some long ones), with token ids."""
    rng = np.random.default_rng(seed)
    prompts: list[list[int]] = []
    for _ in range(num_requests):
        base = prompts[rng.integers(len(prompts))] if prompts and rng.random() < 0.7 else []
        prompts.append(base[:rng.integers(len(base) + 1)] + rng.integers(0, 1000, rng.integers(1, 40)).tolist())
    frame = pl.DataFrame({"request_id": rng.choice(10**6, num_requests, replace=False).tolist(),
                          "arrival_s": np.cumsum(rng.exponential(1.0, num_requests)).tolist(),
                          "output_tokens": [1] * num_requests, "token_ids": prompts})
    return Trace.from_token_ids(frame, sim(BLOCK), source=f"contract[{seed}]")


@pytest.mark.parametrize("name", list(DRIVERS))
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_every_driver_keeps_the_contract(name: str, seed: int) -> None:
    run, block_tokens = DRIVERS[name]
    trace = token_trace(seed)
    result = run(trace)
    check_result(result)
    req = result.requests
    assert req.columns[:len(CORE_REQUEST_COLUMNS)] == list(CORE_REQUEST_COLUMNS)
    assert req["request_id"].to_list() == trace.frame["request_id"].to_list()
    assert req["arrival_s"].to_list() == trace.frame["arrival_s"].to_list()
    inputs = req["input_tokens"].to_numpy().astype(np.int64)
    assert inputs.tolist() == trace.frame["token_ids"].list.len().to_list()
    size = block_tokens(result)
    hits = req["hit_blocks"].to_numpy().astype(np.int64)
    assert req["hit_tokens"].to_list() == np.minimum(hits * size, inputs).tolist()
    assert (hits <= -(-inputs // size)).all()
    if "rejected" in req.columns:
        assert (hits[req["rejected"].to_numpy()] == 0).all()  # a rejected request is all miss
    # the timeline: steps are requests, at their arrival; its hit_blocks add up to each request's
    timeline = result.timeline
    assert timeline["step"].is_between(0, req.height - 1).all()
    arrival = req["arrival_s"].to_numpy()
    assert (timeline["time_s"].to_numpy() == arrival[timeline["step"].to_numpy()]).all()
    per_step = timeline.filter(pl.col("metric") == "hit_blocks").group_by("step").agg(pl.col("value").sum())
    assert dict(per_step.iter_rows()) == dict(enumerate(hits.astype(float).tolist()))
    # the summary: the trace's source, the whole configuration, JSON types, frozen
    d = json.loads(json.dumps(result.summary.to_dict()))
    assert d["driver"] == type(result.summary).driver and d["source"] == trace.source
    assert d["config"] == to_jsonable(result.config) and d["hit_blocks"] == hits.sum()
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.summary.source = "x"


def test_the_vllm_driver_rejects_what_does_not_fit() -> None:
    """The contract trace really exercises rejection (prompts longer than the 12-block pool)."""
    result = DRIVERS["replay-vllm"][0](token_trace(0))
    assert result.requests["rejected"].any() and not result.requests["rejected"].all()


# --- check_result itself --------------------------------------------------------------------

@dataclass(frozen=True)
class ToySummary(RunSummary):
    driver: ClassVar[str] = "toy"
    source: str
    config: object


@dataclass(frozen=True)
class NoSourceSummary(RunSummary):
    driver: ClassVar[str] = "toy"
    config: object


@dataclass(frozen=True)
class NoDriverSummary(RunSummary):
    source: str
    config: object


def toy(**requests_changes: object) -> RunResult:
    requests = pl.DataFrame({
        "request_id": pl.Series([7, 3], dtype=pl.UInt64), "arrival_s": [0.0, 1.0], "input_tokens": [16, 8],
        "hit_blocks": [0, 1], "hit_tokens": [0, 4], "rejected": [False, False], "own": ["a", "b"]})
    requests = requests.with_columns(**requests_changes) if requests_changes else requests
    timeline = timeline_frame([0, 1], [0.0, 1.0], SINGLE_TIER, {"used_blocks": [4, 5]})
    return RunResult(requests, timeline, ToySummary("toy trace", {"capacity_blocks": 8}), {"capacity_blocks": 8})


def test_a_valid_result_passes() -> None:
    assert check_result(toy()) is None


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda r: r.requests, "not a kvlab RunResult: DataFrame"),
    (lambda r: dataclasses.replace(r, requests=r.requests.to_dict()), "requests is a dict, not a polars DataFrame"),
    (lambda r: dataclasses.replace(r, requests=r.requests.drop("hit_tokens")), "requests must start with"),
    (lambda r: dataclasses.replace(r, requests=r.requests.select("arrival_s", pl.exclude("arrival_s"))),
     "requests must start with"),
    (lambda r: toy(request_id=pl.col("request_id").cast(pl.Int64)), "requests.request_id must be unsigned integer"),
    (lambda r: toy(arrival_s=pl.col("arrival_s").cast(pl.Int64)), "requests.arrival_s must be float"),
    (lambda r: toy(hit_blocks=pl.col("hit_blocks").cast(pl.Float64)), "requests.hit_blocks must be integer"),
    (lambda r: toy(rejected=pl.col("rejected").cast(pl.Int8)), "requests.rejected must be Boolean"),
    (lambda r: toy(input_tokens=pl.Series([16, None])), "requests.input_tokens has nulls"),
    (lambda r: toy(request_id=pl.Series([3, 3], dtype=pl.UInt64)), "requests.request_id repeats a value"),
    (lambda r: toy(hit_tokens=pl.Series([0, 9])), r"requests.hit_tokens > input_tokens in 1 row\(s\)"),
    (lambda r: dataclasses.replace(r, timeline=r.timeline.drop("tier")), "timeline must have schema"),
    (lambda r: dataclasses.replace(r, timeline=r.timeline.with_columns(pl.col("step").cast(pl.Int32))),
     "timeline must have schema"),
    (lambda r: dataclasses.replace(r, timeline=None), "timeline must have schema .* got NoneType"),
    (lambda r: dataclasses.replace(r, summary={"source": "toy"}), "summary must be a frozen RunSummary dataclass"),
    (lambda r: dataclasses.replace(r, summary=NoSourceSummary({})), "summary has no field 'source'"),
    (lambda r: dataclasses.replace(r, summary=NoDriverSummary("toy", {})), "NoDriverSummary.driver is not set"),
    (lambda r: dataclasses.replace(r, summary=ToySummary("toy", {"rng": np.random.default_rng(0)})),
     "summary.to_dict.. is not JSON: cannot turn a Generator into JSON"),
])
def test_check_result_names_each_violation(mutate: Callable[[RunResult], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_result(mutate(toy()))


def test_check_result_reports_every_violation_at_once() -> None:
    broken = dataclasses.replace(toy(rejected=pl.col("rejected").cast(pl.Int8)), timeline=None)
    with pytest.raises(ValueError) as info:
        check_result(broken)
    assert "requests.rejected must be Boolean" in str(info.value) and "timeline must have schema" in str(info.value)
