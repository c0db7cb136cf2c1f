"""Mooncake FAST'25 on the timed cluster: Figure 10 (global vs local cache) and the §5.3
scheduler comparison (Figure 5), plus the routing-staleness sweep (cluster_sim.md P1, P2, P6;
rules C20–C22). docs/global_cache.md states every assumption and how close each number comes.

The paper gives the testbed (LLaMA3-70B on 8×A800 nodes with four 200 Gb/s NICs, Store blocks
of 256 tokens, 10 prefill nodes × 3 M tokens for Figure 10 with outputs cut to one token, 16
nodes for §5.3) and not the rest: :class:`MooncakeSetup` marks each value it had to choose.
Values read from the paper are :data:`PAPER_FIGURE10` and :data:`PAPER_TTFT_MEAN_S`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

import polars as pl

from kvlab.core.validate import check_count, check_list, check_positive, check_real
from kvlab.index.faults import FaultInjector
from kvlab.sim.cluster.conductor import Conductor
from kvlab.sim.cluster.config import ClusterConfig, ClusterTier
from kvlab.sim.cluster.routers import ROUTERS
from kvlab.sim.cluster.sweep import sweep as cluster_sweep
from kvlab.traces import Trace

#: Figure 10's labels, read from the paper (FAST'25 p. 11): global/local ratios of the hit rate
#: and of the mean prefill GPU time per request, per trace.
PAPER_FIGURE10 = {"conversation": (2.22, 0.76), "tool&agent": (1.38, 0.74), "synthetic": (2.36, 0.52)}
#: Figure 5's mean TTFT (s) per prefill scheduler, conversation trace, read from the paper (FAST'25 §4.2).
PAPER_TTFT_MEAN_S = {"random": 19.65, "load_balance": 5.27, "local_cache_aware": 3.58, "conductor": 3.07}
#: The issue's bar for Figure 10's ratios (relative error).
FIGURE10_TOLERANCE = 0.15
#: The §5.3 schedulers in the paper's order (kvlab router names).
SCHEDULERS = ("random", "load_balance", "local_cache_aware", "conductor")


@dataclass(frozen=True)
class MooncakeSetup:
    """The Mooncake cluster of FAST'25 §5 as kvlab simulates it (``(paper)``: read from the paper).

    Args:
        num_workers: prefill nodes (Figure 10: 10, paper; §5.3 uses :meth:`for_section53`).
        cache_tokens: each node's DRAM cache (3 M tokens, paper §5.3.1–5.3.2).
        gpu_cache_tokens: each node's HBM KV pool (assumed: 262,144 tokens — room for the longest
            prompt, so the DRAM cache is "the node's cache"; ``None`` derives it from the HBM).
        block_size: KV block size, tokens (256: Mooncake Store's, paper §5.1).
        model, gpu, tp: a dummy LLaMA3-70B on 8×A800 (paper §5.1).
        network: the node's NICs, 4×200 Gb/s (paper §5.1).
        router: the scheduler (Figure 10: "nodes with higher prefix match ratios" — local
            cache-aware, the same for both scopes, C20).
        kvcache_balancing_threshold: the Conductor's copy threshold where the router is
            ``"conductor"`` (assumed 1.5: "adjusted manually" in the paper).
        output_tokens: every request's output length (Figure 10: 1, paper; ``None`` keeps the trace's).
        time_scale: arrival-time multiplier (assumed 1.0: the trace's own timestamps).
        seed: the simulation's seed (C24).

    Raises:
        ValueError: a bad value, naming the field.

    Example:
        >>> MooncakeSetup().config("global").tiers[0].capacity_blocks
        11718
    """

    num_workers: int = 10
    cache_tokens: int = 3_000_000
    gpu_cache_tokens: int | None = 262_144
    block_size: int = 256
    model: str = "Llama-3-70B"
    gpu: str = "A800"
    tp: int = 8
    network: str = "rdma_4x200gbps"
    router: str = "local_cache_aware"
    kvcache_balancing_threshold: float = 1.5
    output_tokens: int | None = 1
    time_scale: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_workers", "cache_tokens", "block_size", "tp"):
            check_positive(name, getattr(self, name))
        check_positive("gpu_cache_tokens", self.gpu_cache_tokens, optional=True)
        check_positive("output_tokens", self.output_tokens, optional=True)
        check_real("time_scale", self.time_scale, low=0.0, low_open=True)
        check_real("kvcache_balancing_threshold", self.kvcache_balancing_threshold, low=0.0, low_open=True)
        check_count("seed", self.seed)
        if not isinstance(self.router, str) or self.router not in ROUTERS:
            raise ValueError(f"router must be one of {sorted(ROUTERS)}, got {self.router!r}")
        if self.cache_tokens < self.block_size:
            raise ValueError(f"cache_tokens={self.cache_tokens} holds no {self.block_size}-token block")

    @classmethod
    def for_section53(cls, **changes: object) -> MooncakeSetup:
        """§5.3's cluster: 16 nodes of which 8 prefill (assumed: the split is not given; only the
        prefill pool sets TTFT in P/D, so decode nodes are not simulated), the DRAM cache and
        HBM as Figure 10, outputs cut to one token (TTFT only), the Conductor's threshold 1.1
        (the best of 1.1, 1.25, 1.5, 2.0 swept on the conversation trace: docs/global_cache.md)."""
        return cls(**{"num_workers": 8, "kvcache_balancing_threshold": 1.1, **changes})

    def config(self, cache_scope: str = "local", **overrides: object) -> ClusterConfig:
        """The :class:`~kvlab.sim.cluster.ClusterConfig` of this setup (``overrides`` win; the router
        name ``"conductor"`` becomes a :class:`~kvlab.sim.cluster.Conductor` with this setup's
        threshold)."""
        gpu_blocks = None if self.gpu_cache_tokens is None else -(-self.gpu_cache_tokens // self.block_size)
        base = {"num_workers": self.num_workers, "model": self.model, "gpu": self.gpu, "tp": self.tp,
                "block_size": self.block_size, "capacity_blocks": gpu_blocks,
                "tiers": (ClusterTier("DRAM", self.cache_tokens // self.block_size),), "cache_scope": cache_scope,
                "network": self.network, "router": self.router, "seed": self.seed,
                "store_high_watermark": 0.9, "store_eviction_ratio": 0.05}
        merged = {**base, **overrides}
        if merged["router"] == "conductor":
            merged["router"] = Conductor(kvcache_balancing_threshold=self.kvcache_balancing_threshold)
        return ClusterConfig(**merged)

    def workload(self, trace: Trace) -> Trace:
        """``trace`` with every output cut to :attr:`output_tokens` (unchanged when ``None``)."""
        if self.output_tokens is None:
            return trace
        frame = trace.frame.with_columns(pl.lit(self.output_tokens, dtype=trace.frame["output_tokens"].dtype)
                                         .alias("output_tokens"))
        return replace(trace, frame=frame)

    def assumptions(self) -> list[str]:
        """The setup as caption lines: what it takes from the paper, then each value it chose."""
        out = [f"{self.num_workers} prefill nodes x {self.cache_tokens:,} DRAM tokens, {self.block_size}-token blocks, "
               f"{self.model} on {self.tp}x{self.gpu}"
               + ("" if self.output_tokens is None else f", outputs cut to {self.output_tokens} token(s)")]
        assumed = []
        if self.gpu_cache_tokens is not None:
            assumed.append(f"HBM KV pool {self.gpu_cache_tokens:,} tokens per node")
        assumed.append(f"arrivals at the trace's timestamps x {self.time_scale:g}")
        assumed.append("prefill time from kvlab's roofline (the paper's polynomial is not given)")
        assumed.append(f"Conductor threshold {self.kvcache_balancing_threshold:g}")
        return [*out, *(f"assumed: {a}" for a in assumed)]


def _sweep(trace: Trace, config: ClusterConfig, keys: list[dict[str, object]], points: list[dict[str, object]],
           time_scale: float, executor: object, progress: bool) -> pl.DataFrame:
    """``keys`` (the row labels) beside the figure's metrics of each point's run (a cluster sweep)."""
    frame = cluster_sweep(trace, points, config=config, executor=executor, progress=progress, time_scale=time_scale)
    return pl.concat([pl.DataFrame(keys), figure_metrics(frame)], how="horizontal")


def figure_metrics(frame: pl.DataFrame) -> pl.DataFrame:
    """The experiments' columns of a cluster sweep frame (or rows of
    :func:`kvlab.sim.cluster.sweep.summary_row`): ``requests``, ``token_hit_ratio``,
    ``gpu_hit_ratio``, ``remote_store_ratio``, ``prefill_gpu_s_per_request`` (prefill GPU seconds
    over admitted requests), ``ttft_mean_s``, ``ttft_p99_s``, ``rejected_requests``, ``wall_s``."""
    return frame.select(
        "requests", "token_hit_ratio", "gpu_hit_ratio", "remote_store_ratio",
        (pl.col("prefill_gpu_s") / pl.max_horizontal(pl.col("requests") - pl.col("rejected_requests"), pl.lit(1)))
        .alias("prefill_gpu_s_per_request"),
        "ttft_mean_s", "ttft_p99_s", "rejected_requests", "wall_s")


def figure10(traces: Mapping[str, Trace], setup: MooncakeSetup | None = None, routers: Iterable[str] | None = None,
             *, executor: object = None, progress: bool = False) -> pl.DataFrame:
    """Figure 10: each trace under ``cache_scope="local"`` and ``"global"``, the same scheduler
    for both (C20); ``routers`` (default: the setup's) repeats it per scheduler.

    Returns:
        One row per (trace, router, scope): ``trace``, ``router``, ``cache_scope`` (str), ``requests``,
        ``token_hit_ratio``, ``gpu_hit_ratio``, ``remote_store_ratio``,
        ``prefill_gpu_s_per_request`` (the paper's "average GPU computation time for prefill"),
        ``ttft_mean_s``, ``ttft_p99_s``, ``rejected_requests``, ``wall_s``.

    Raises:
        ValueError: no traces, or a value that is not a Trace.
    """
    setup = _setup(setup, MooncakeSetup)
    names = [setup.router] if routers is None else _names("routers", routers)
    frames = []
    for name, trace in _traces(traces).items():
        keys = [{"trace": name, "router": r, "cache_scope": s} for r in names for s in ("local", "global")]
        points = [{"cache_scope": k["cache_scope"], "router": setup.config(router=k["router"]).router} for k in keys]
        frames.append(_sweep(setup.workload(trace), setup.config(), keys, points, setup.time_scale, executor,
                             progress))
    return pl.concat(frames)


def figure10_ratios(frame: pl.DataFrame, tolerance: float = FIGURE10_TOLERANCE) -> pl.DataFrame:
    """Global/local ratios of :func:`figure10`'s frame beside the paper's.

    Returns:
        One row per (trace, router, metric): ``trace``, ``router``, ``metric`` (``hit_rate`` or
        ``prefill_gpu_time``),
        ``kvlab``, ``paper`` (null for a trace the paper does not show), ``error`` (kvlab/paper − 1),
        ``within_tolerance`` (bool), ``paper_source``.
    """
    check_real("tolerance", tolerance, low=0.0)
    need = {"trace", "router", "cache_scope", "token_hit_ratio", "prefill_gpu_s_per_request"}
    if not isinstance(frame, pl.DataFrame) or not need <= set(frame.columns):
        raise ValueError(f"frame must be figure10()'s frame (columns {sorted(need)}), got "
                         f"{frame.columns if isinstance(frame, pl.DataFrame) else type(frame).__name__}")
    rows = []
    for name, router in frame.select("trace", "router").unique(maintain_order=True).iter_rows():
        by = {r["cache_scope"]: r for r in frame.filter((pl.col("trace") == name) & (pl.col("router") == router))
              .iter_rows(named=True)}
        glob, loc = by["global"], by["local"]
        ours = {"hit_rate": glob["token_hit_ratio"] / loc["token_hit_ratio"],
                "prefill_gpu_time": glob["prefill_gpu_s_per_request"] / loc["prefill_gpu_s_per_request"]}
        paper = PAPER_FIGURE10.get(name)
        for k, metric in enumerate(ours):
            p = None if paper is None else paper[k]
            error = None if p is None else ours[metric] / p - 1
            rows.append({"trace": name, "router": router, "metric": metric, "kvlab": ours[metric], "paper": p,
                         "error": error,
                         "within_tolerance": None if error is None else abs(error) <= tolerance,
                         "paper_source": "read from FAST'25 Figure 10 labels" if p is not None else None})
    return pl.DataFrame(rows, schema={"trace": pl.String, "router": pl.String, "metric": pl.String,
                                      "kvlab": pl.Float64,
                                      "paper": pl.Float64, "error": pl.Float64, "within_tolerance": pl.Boolean,
                                      "paper_source": pl.String})


def scheduler_comparison(trace: Trace, setup: MooncakeSetup | None = None, schedulers: Iterable[str] = SCHEDULERS,
                         *, executor: object = None, progress: bool = False) -> pl.DataFrame:
    """§5.3 / Figure 5: mean TTFT of each prefill scheduler on one trace (local caches, C21);
    ``executor`` as :func:`figure10`.

    Returns:
        One row per scheduler (in the given order): ``router``, the :func:`figure10` columns,
        ``paper_ttft_mean_s`` (read from Figure 5; null for a router the paper does not show).

    Raises:
        ValueError: an unknown router name, an empty list.
    """
    setup = _setup(setup, MooncakeSetup.for_section53)
    names = _names("schedulers", schedulers)
    if not isinstance(trace, Trace):
        raise ValueError(f"trace must be a kvlab Trace, got {type(trace).__name__}")
    points = [{"router": setup.config(router=n).router} for n in names]
    frame = _sweep(setup.workload(trace), setup.config(), [{"router": n} for n in names], points, setup.time_scale,
                   executor, progress)
    return frame.with_columns(pl.Series("paper_ttft_mean_s", [PAPER_TTFT_MEAN_S.get(n) for n in names],
                                        dtype=pl.Float64))


def ordering_holds(comparison: pl.DataFrame) -> bool:
    """Whether mean TTFT falls in the paper's order: random > load balancing > local
    cache-aware > global cache-aware (the schedulers :func:`scheduler_comparison` ran)."""
    ttft = dict(zip(comparison["router"], comparison["ttft_mean_s"], strict=True))
    order = [ttft[n] for n in SCHEDULERS if n in ttft]
    return all(a > b for a, b in zip(order, order[1:]))


def staleness_sweep(trace: Trace, config: ClusterConfig, snapshot_intervals_s: Iterable[float] = (0.0, 0.01, 0.1),
                    event_delays_s: Iterable[float] = (0.0, 0.1), *, time_scale: float = 1.0,
                    executor: object = None, progress: bool = False) -> pl.DataFrame:
    """C22: one run per (KV-event delay, load-snapshot interval) — the index sees each batch
    ``delay`` seconds late (a :class:`~kvlab.index.FaultInjector` on the simulated clock), the
    router's loads are refreshed every ``interval`` (0: live). BLIS reports TTFT p99 +14 % at a
    10 ms refresh and +354 % at 100 ms on its workload (P6: qualitative only here). ``executor``
    as :func:`figure10`.

    Returns:
        One row per point, delays outer: ``event_delay_s``, ``snapshot_interval_s``, then the
        :func:`figure10` columns.

    Raises:
        ValueError: an empty or negative grid, a config that is not a ClusterConfig.
    """
    if not isinstance(config, ClusterConfig):
        raise ValueError(f"config must be a ClusterConfig, got {type(config).__name__}")
    intervals = [check_real("snapshot_intervals_s", v, low=0.0) for v in snapshot_intervals_s]
    delays = [check_real("event_delays_s", v, low=0.0) for v in event_delays_s]
    if not intervals or not delays:
        raise ValueError("snapshot_intervals_s and event_delays_s need at least one value each")
    keys = [{"event_delay_s": d, "snapshot_interval_s": i} for d in delays for i in intervals]
    points = [stale(k["event_delay_s"], k["snapshot_interval_s"]) for k in keys]
    return _sweep(trace, config, keys, points, time_scale, executor, progress)


def stale(event_delay_s: float, snapshot_interval_s: float) -> dict[str, object]:
    """The :class:`ClusterConfig` fields of a staleness point: KV events ``event_delay_s`` late
    through a :class:`~kvlab.index.FaultInjector` (none at 0: delivered at once), loads
    refreshed every ``snapshot_interval_s`` (0: live)."""
    return {"snapshot_interval_s": snapshot_interval_s,
            "faults": FaultInjector(delay_s=event_delay_s) if event_delay_s else None}


def _setup(setup: object, default: Callable[[], MooncakeSetup]) -> MooncakeSetup:
    if setup is None:
        return default()
    if not isinstance(setup, MooncakeSetup):
        raise ValueError(f"setup must be a MooncakeSetup or None, got {setup!r}")
    return setup


def _names(field: str, names: object) -> list[str]:
    """Router names, each known."""
    names = check_list(field, names)
    for name in names:
        if not isinstance(name, str) or name not in ROUTERS:
            raise ValueError(f"{field}: {name!r} is not a router name; routers: {sorted(ROUTERS)}")
    return names


def _traces(traces: Mapping[str, Trace]) -> dict[str, Trace]:
    if not isinstance(traces, Mapping) or not traces:
        raise ValueError(f"traces must be a non-empty mapping of name -> Trace, got {traces!r}")
    for name, trace in traces.items():
        if not isinstance(trace, Trace):
            raise ValueError(f"traces[{name!r}] must be a kvlab Trace, got {type(trace).__name__}")
    return dict(traces)


__all__ = ["FIGURE10_TOLERANCE", "PAPER_FIGURE10", "PAPER_TTFT_MEAN_S", "SCHEDULERS", "MooncakeSetup", "figure10",
           "figure10_ratios", "figure_metrics", "ordering_holds", "scheduler_comparison", "stale", "staleness_sweep"]
