"""The frames and the summary of a cluster simulation (cluster_sim.md §6.8), as polars.

Definitions (C12, C13): TTFT = ``first_token_s − arrival_s`` (router, transfer, queue, fetch
and prefill included); TBT = the gaps between a request's consecutive output tokens (Mooncake's
TBT, BLIS's ITL); prefill GPU seconds = the prefill share of every step's time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import polars as pl

from kvlab.core.result import RunResult, RunSummary, timeline_frame
from kvlab.sim.cluster.config import ClusterConfig

#: Points per worker and metric kept in the timeline (evenly spaced steps; ``steps`` has all).
TIMELINE_POINTS = 2_000

STEP_COLUMNS = ("worker", "step", "t_start_s", "dt_s", "dt_prefill_s", "num_prefill_requests", "num_prefill_tokens",
                "num_decode", "num_running", "num_waiting", "num_fetching", "free_blocks", "num_preempted")
TRANSFER_SCHEMA = {"kind": pl.String, "worker": pl.String, "src": pl.String, "dst": pl.String,
                   "request_id": pl.Int64, "bytes": pl.Int64, "start_s": pl.Float64, "end_s": pl.Float64}


@dataclass(frozen=True, eq=False)
class ClusterResult(RunResult):
    """A :class:`~kvlab.core.RunResult` with the simulation's two extra frames.

    Attributes:
        steps: one row per engine step (every ``config.step_sample``-th), by start time, worker and
            step: ``worker``, ``step`` (the worker's step number, from 1), ``t_start_s``,
            ``dt_s``, ``dt_prefill_s``, ``num_prefill_requests``, ``num_prefill_tokens``,
            ``num_decode``, ``num_running``, ``num_waiting``, ``num_fetching``, ``free_blocks``,
            ``num_preempted``, ``kv_util`` (share of the worker's blocks in use).
        transfers: one row per transfer: ``kind`` (``fetch``, ``transfer``, ``handoff``,
            ``offload``), ``worker`` (whose link), ``src``, ``dst``, ``request_id`` (-1 for an
            offload), ``bytes``, ``start_s``, ``end_s``.
    """

    steps: pl.DataFrame = field(default_factory=pl.DataFrame)
    transfers: pl.DataFrame = field(default_factory=pl.DataFrame)


@dataclass(frozen=True)
class ClusterSummary(RunSummary):
    """Totals of one :func:`~kvlab.sim.cluster.simulate` run (times in simulated seconds).

    Latency percentiles (``_mean_s``, ``_p50_s``, ``_p90_s``, ``_p99_s``) over completed
    requests for TTFT and E2E, over every token gap for TBT (``None`` when there is none).
    ``goodput_rps``: completed requests meeting both SLOs (an unset SLO always holds) per
    second of ``makespan_s`` (first arrival to last finish). Hit ratios are token shares of
    the admitted prompts: ``gpu_hit_ratio``, ``tier_hit_ratio`` (per tier), ``remote_hit_ratio``
    (cache transfers), ``token_hit_ratio`` (all three); ``remote_store_ratio``: the tier hits read
    from another worker's segment of the global pool (C20; 0 in local scope). ``prefill_gpu_s``:
    prefill GPU seconds over all workers (C12; Mooncake Fig. 10 plots its mean per request).
    ``busy_share``: each worker's busy time over the makespan. ``time_scale`` and ``rate``: how
    the trace's arrivals were re-timed (:func:`~kvlab.sim.cluster.arrival_times`). ``events``:
    heap events processed; ``wall_s`` and ``simulated_requests_per_s``: the simulator's own speed.
    ``block_identity``: whether the trace's block keys identify prompt prefixes (``False`` for
    token-count traces such as Azure's and Vidur's: placeholder keys, so no prefix can hit and
    the hit ratios are 0 by construction, not measured).

    Example:
        >>> ClusterSummary.driver
        'simulate'
    """

    driver: ClassVar[str] = "simulate"
    source: str
    config: ClusterConfig
    time_scale: float
    rate: float | None
    requests: int
    completed_requests: int
    rejected_requests: int
    input_tokens: int
    output_tokens: int
    computed_prefill_tokens: int
    token_hit_ratio: float
    gpu_hit_ratio: float
    tier_hit_ratio: dict[str, float]
    remote_hit_ratio: float
    remote_store_ratio: float
    ttft_mean_s: float | None
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    ttft_p99_s: float | None
    tbt_mean_s: float | None
    tbt_p50_s: float | None
    tbt_p90_s: float | None
    tbt_p99_s: float | None
    e2e_mean_s: float | None
    e2e_p50_s: float | None
    e2e_p90_s: float | None
    e2e_p99_s: float | None
    goodput_rps: float
    makespan_s: float
    prefill_gpu_s: float
    decode_gpu_s: float
    busy_share: dict[str, float]
    preemptions: int
    steps: int
    events: int
    wall_s: float
    simulated_requests_per_s: float
    block_identity: bool = True


def _stats(values: np.ndarray, prefix: str) -> dict[str, float | None]:
    if values.size == 0:
        return {f"{prefix}_{k}_s": None for k in ("mean", "p50", "p90", "p99")}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {f"{prefix}_mean_s": float(values.mean()), f"{prefix}_p50_s": float(p50), f"{prefix}_p90_s": float(p90),
            f"{prefix}_p99_s": float(p99)}


def _truth(columns: tuple[int, int, int] | None) -> dict[str, object]:
    """The index-vs-truth columns (null without an index)."""
    if columns is None:
        return dict.fromkeys(("index_prefix_blocks", "true_prefix_blocks", "best_true_prefix_blocks", "wrong"))
    return {"index_prefix_blocks": columns[0], "true_prefix_blocks": columns[1],
            "best_true_prefix_blocks": columns[2], "wrong": columns[1] < columns[2]}


def requests_frame(loop: object) -> pl.DataFrame:
    """One row per request (cluster_sim.md §6.8; the core columns first)."""
    cfg: ClusterConfig = loop.config
    bs = cfg.block_size
    names = [w.name for w in loop.workers]
    tiers = [t.name for t in cfg.tiers]
    rows: dict[str, list] = {k: [] for k in (
        "request_id", "arrival_s", "input_tokens", "hit_blocks", "hit_tokens", "rejected", "reject_reason", "worker",
        "decode_worker", "predicted_ttft_s", "enqueue_s", "first_scheduled_s", "fetch_s", "transfer_s",
        "first_token_s", "finish_s", "ttft_s", "e2e_s", "queue_s", "tbt_mean_s", "tbt_p99_s", "tbt_max_s",
        "output_tokens", "gpu_hit_tokens", *[f"tier_hit_tokens_{t}" for t in tiers], "remote_store_tokens",
        "remote_hit_tokens", "computed_prefill_tokens", "blend_tokens", "blend_recomputed_tokens", "preemptions",
        "recomputed_tokens",
        "slo_ttft_ok", "slo_tbt_ok", "index_prefix_blocks", "true_prefix_blocks", "best_true_prefix_blocks", "wrong")}
    for r in loop.requests:
        tier_tokens = r.tier_hit_tokens or [0] * len(tiers)
        hit = r.gpu_hit_tokens + sum(tier_tokens) + r.remote_hit_tokens
        tbt = np.asarray(r.tbt)
        ttft = None if r.first_token_s is None else r.first_token_s - r.arrival_s
        done = r.state == "DONE"
        values = {
            "request_id": r.request_id, "arrival_s": r.arrival_s, "input_tokens": r.input_tokens,
            "hit_blocks": -(-hit // bs), "hit_tokens": hit, "rejected": r.rejected,
            "reject_reason": r.reject_reason or None,
            "worker": None if r.worker is None else names[r.worker],
            "decode_worker": None if r.decode_worker is None else names[r.decode_worker],
            "predicted_ttft_s": r.predicted_ttft_s, "enqueue_s": r.enqueue_s, "first_scheduled_s": r.first_scheduled_s,
            "fetch_s": r.fetch_s, "transfer_s": r.transfer_s, "first_token_s": r.first_token_s,
            "finish_s": r.finish_s, "ttft_s": ttft, "e2e_s": None if r.finish_s is None else r.finish_s - r.arrival_s,
            "queue_s": None if r.first_scheduled_s is None else r.first_scheduled_s - r.arrival_s,
            "tbt_mean_s": float(tbt.mean()) if tbt.size else None,
            "tbt_p99_s": float(np.percentile(tbt, 99)) if tbt.size else None,
            "tbt_max_s": float(tbt.max()) if tbt.size else None,
            "output_tokens": r.output_tokens, "gpu_hit_tokens": r.gpu_hit_tokens,
            **{f"tier_hit_tokens_{t}": tier_tokens[i] for i, t in enumerate(tiers)},
            "remote_store_tokens": r.remote_store_tokens,
            "remote_hit_tokens": r.remote_hit_tokens, "computed_prefill_tokens": r.computed_prefill_tokens,
            "blend_tokens": r.blend_tokens, "blend_recomputed_tokens": r.blend_recomputed_tokens,
            "preemptions": r.preemptions, "recomputed_tokens": r.recomputed_tokens,
            "slo_ttft_ok": done and (cfg.slo_ttft_s is None or ttft <= cfg.slo_ttft_s),
            "slo_tbt_ok": done and (cfg.slo_tbt_s is None or not tbt.size or float(tbt.max()) <= cfg.slo_tbt_s),
            **_truth(r.index_columns if loop.index is not None and r.worker is not None else None),
        }
        for k, v in values.items():
            rows[k].append(v)
    schema = {k: pl.Int64 for k in rows}
    schema.update({k: pl.Float64 for k in rows if k.endswith("_s")})
    schema.update({"request_id": pl.UInt64, "rejected": pl.Boolean, "reject_reason": pl.String, "worker": pl.String,
                   "decode_worker": pl.String, "slo_ttft_ok": pl.Boolean, "slo_tbt_ok": pl.Boolean,
                   "wrong": pl.Boolean})
    return pl.DataFrame(rows, schema=schema)


def steps_frame(loop: object) -> pl.DataFrame:
    """The sampled steps, in (start time, worker) order."""
    names = [w.name for w in loop.workers]
    schema = dict.fromkeys(STEP_COLUMNS, pl.Int64) | {"t_start_s": pl.Float64, "dt_s": pl.Float64,
                                                      "dt_prefill_s": pl.Float64}
    frames = [pl.DataFrame(loop.step_rows, schema=schema, orient="row")]
    chunks = loop.step_chunks  # decode windows (C9): decode-only steps, as arrays; one frame for all
    if chunks:
        sizes = np.array([len(c[3]) for c in chunks])
        per_step = {name: np.repeat(np.array([c[i] for c in chunks], dtype=np.int64), sizes)
                    for i, name in ((0, "worker"), (1, "num_decode"))}
        zeros = np.zeros(int(sizes.sum()), dtype=np.int64)
        frames.append(pl.DataFrame({
            "worker": per_step["worker"], "step": np.concatenate([c[2] for c in chunks]),
            "t_start_s": np.concatenate([c[3] for c in chunks]), "dt_s": np.concatenate([c[4] for c in chunks]),
            "dt_prefill_s": zeros.astype(np.float64), "num_prefill_requests": zeros, "num_prefill_tokens": zeros,
            "num_decode": per_step["num_decode"], "num_running": per_step["num_decode"], "num_waiting": zeros,
            "num_fetching": zeros, "free_blocks": np.concatenate([c[5] for c in chunks]), "num_preempted": zeros},
            schema=schema))
    frame = pl.concat(frames).sort("t_start_s", "worker", "step")
    capacity = loop.config.capacity_blocks
    return frame.with_columns(pl.col("worker").replace_strict(list(range(len(names))), names, return_dtype=pl.String),
                              kv_util=1.0 - pl.col("free_blocks") / capacity)


def transfers_frame(loop: object) -> pl.DataFrame:
    """The transfers, in (start, end, worker) order."""
    names = [w.name for w in loop.workers]
    rows = sorted(((kind, names[w], src, dst, rid, size, start, end)
                   for kind, w, src, dst, rid, size, start, end in loop.transfer_rows),
                  key=lambda row: (row[6], row[7], row[1], row[0]))
    return pl.DataFrame(rows, schema=TRANSFER_SCHEMA, orient="row")


def timeline(steps: pl.DataFrame, loop: object) -> pl.DataFrame:
    """Per worker (the ``tier`` column), at most :data:`TIMELINE_POINTS` evenly spaced steps:
    ``running_requests``, ``waiting_requests``, ``fetching_requests``, ``used_blocks``,
    ``free_blocks``, ``capacity_blocks``."""
    capacity = loop.config.capacity_blocks
    frames = []
    for w in loop.workers:
        mine = steps.filter(pl.col("worker") == w.name)
        if mine.height > TIMELINE_POINTS:
            mine = mine[np.linspace(0, mine.height - 1, TIMELINE_POINTS).astype(np.int64)]
        free = mine["free_blocks"].to_numpy()
        frames.append(timeline_frame(np.arange(mine.height), mine["t_start_s"].to_numpy(), w.name, {
            "running_requests": mine["num_running"].to_numpy(), "waiting_requests": mine["num_waiting"].to_numpy(),
            "fetching_requests": mine["num_fetching"].to_numpy(), "used_blocks": capacity - free,
            "free_blocks": free, "capacity_blocks": np.full(mine.height, capacity)}))
    return pl.concat(frames) if frames else timeline_frame([], [], "w0", {})


def summary(source: str, loop: object, requests: pl.DataFrame, *, time_scale: float = 1.0,
            rate: float | None = None, block_identity: bool = True) -> ClusterSummary:
    """The :class:`ClusterSummary` of a finished loop (``block_identity``: the trace's)."""
    cfg: ClusterConfig = loop.config
    done = requests.filter(pl.col("finish_s").is_not_null())
    admitted = requests.filter(~pl.col("rejected"))
    inputs = int(admitted["input_tokens"].sum())

    def share(column: str) -> float:
        return float(admitted[column].sum()) / inputs if inputs else 0.0

    gaps = np.concatenate([np.asarray(r.tbt) for r in loop.requests]) if loop.requests else np.zeros(0)
    start = float(requests["arrival_s"].min()) if requests.height else 0.0
    end = float(done["finish_s"].max()) if done.height else start
    makespan = end - start
    good = int((done["slo_ttft_ok"] & done["slo_tbt_ok"]).sum())
    return ClusterSummary(
        source=source, config=cfg, time_scale=time_scale, rate=rate, requests=requests.height,
        completed_requests=done.height,
        rejected_requests=int(requests["rejected"].sum()), input_tokens=inputs,
        output_tokens=int(done["output_tokens"].sum()),
        computed_prefill_tokens=int(requests["computed_prefill_tokens"].sum()),
        token_hit_ratio=share("hit_tokens"), gpu_hit_ratio=share("gpu_hit_tokens"),
        tier_hit_ratio={t.name: share(f"tier_hit_tokens_{t.name}") for t in cfg.tiers},
        remote_hit_ratio=share("remote_hit_tokens"), remote_store_ratio=share("remote_store_tokens"),
        **_stats(done["ttft_s"].to_numpy(), "ttft"), **_stats(gaps, "tbt"), **_stats(done["e2e_s"].to_numpy(), "e2e"),
        goodput_rps=good / makespan if makespan > 0 else 0.0, makespan_s=makespan,
        prefill_gpu_s=sum(w.prefill_gpu_s for w in loop.workers),
        decode_gpu_s=sum(w.decode_gpu_s for w in loop.workers),
        busy_share={w.name: (w.busy_s / makespan if makespan > 0 else 0.0) for w in loop.workers},
        preemptions=sum(w.preemptions for w in loop.workers), steps=sum(w.step_seq for w in loop.workers),
        events=loop.events, wall_s=loop.wall_s,
        simulated_requests_per_s=requests.height / loop.wall_s if loop.wall_s > 0 else 0.0,
        block_identity=block_identity)
