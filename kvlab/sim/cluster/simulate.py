"""``simulate``: a trace through a timed cluster of engine-faithful workers (cluster_sim.md §6)."""

from __future__ import annotations

import numpy as np

from kvlab.core.validate import check_flag, check_real, config_with
from kvlab.sim.cluster.config import ClusterConfig
from kvlab.sim.cluster.loop import ClusterLoop
from kvlab.sim.cluster.metrics import ClusterResult, requests_frame, steps_frame, summary, timeline, transfers_frame
from kvlab.sim.cluster.prompts import PromptSource
from kvlab.traces import Trace


def arrival_times(trace: Trace, *, time_scale: float = 1.0, rate: float | None = None, seed: int = 0) -> np.ndarray:
    """The arrival times (float64 seconds, one per request) a simulation runs the trace at.

    ``time_scale`` multiplies the trace's times (0.5: twice the load); ``rate`` (requests/s)
    replaces them by a Poisson process from the first arrival, drawn from the arrivals'
    own generator (C24: ``default_rng([seed, 0])``), the requests kept in trace order.

    Raises:
        ValueError: ``time_scale`` or ``rate`` not > 0.

    >>> from kvlab.traces import load_trace
    >>> trace = load_trace("conversation").head(500)
    >>> float(arrival_times(trace, time_scale=0.5)[-1]) == trace.frame["arrival_s"][-1] * 0.5
    True
    >>> times = arrival_times(trace, rate=2.0)       # Poisson, 2 requests/s
    >>> times.size, bool((times[1:] >= times[:-1]).all())
    (500, True)
    """
    time_scale = check_real("time_scale", time_scale, low=0.0, low_open=True)
    rate = check_real("rate", rate, low=0.0, low_open=True, optional=True)
    if rate is not None and time_scale != 1.0:
        raise ValueError(f"give rate (Poisson re-timing) or time_scale (scaled trace times), not both: "
                         f"rate={rate}, time_scale={time_scale}")
    times = trace.frame["arrival_s"].to_numpy().astype(np.float64)
    if rate is not None:
        gaps = np.random.default_rng([seed, 0]).exponential(1.0 / rate, times.size)
        if times.size:
            gaps[0] = 0.0
        return (times[0] if times.size else 0.0) + np.cumsum(gaps)
    return times * time_scale


def simulate(trace: Trace, config: ClusterConfig | None = None, *, time_scale: float = 1.0, rate: float | None = None,
             progress: bool = False, **overrides: object) -> ClusterResult:
    """Serve ``trace`` on a simulated cluster and measure TTFT, TBT, E2E, hits and GPU time.

    Each request arrives (at its trace time, scaled, or Poisson at ``rate``), is routed by the
    configured router over the workers' load signals and the event-fed index, waits, loads tier
    hits (FETCH_KVC), runs vLLM v1 scheduling steps timed by the time model, and finishes; see
    :mod:`kvlab.sim.cluster` for the model and the rules it cites.

    Args:
        trace: the requests (``request_id``, ``arrival_s``, ``input_tokens``, ``output_tokens``,
            chained ``block_keys``). A trace without block identity (Azure, Vidur: token counts
            only) runs too: its placeholder keys never repeat, so nothing hits and TTFT comes
            from load and batching alone; the summary's ``block_identity`` says so.
        config: a :class:`~kvlab.sim.cluster.config.ClusterConfig` (``None``: its defaults).
        time_scale, rate: as :func:`arrival_times`.
        progress: a tqdm bar on stderr (requests finished).
        **overrides: :class:`ClusterConfig` fields replacing ``config``'s (``num_workers=4``).

    Returns:
        A :class:`~kvlab.sim.cluster.metrics.ClusterResult` — ``requests`` (one row per
        request: the core columns, ``rejected``, times, TTFT/E2E/queue, TBT mean/p99/max, hits
        per tier, computed and recomputed prefill tokens, preemptions, SLO flags, the index's
        credit vs the truth), ``timeline`` (per worker), ``steps``, ``transfers``, ``summary``
        (a :class:`~kvlab.sim.cluster.metrics.ClusterSummary`) and ``config``.

    Raises:
        ValueError: not a Trace, a bad configuration field (named), a trace without
            ``output_tokens``, a router returning a bad decision.

    Example:
        >>> from kvlab.traces import load_trace
        >>> result = simulate(load_trace("conversation").head(20), num_workers=2, capacity_blocks=20_000)
        >>> result.summary.completed_requests, result.requests["ttft_s"].min() > 0
        (20, True)
    """
    if not isinstance(trace, Trace):
        raise ValueError(f"trace must be a kvlab Trace, got {type(trace).__name__}")
    config = config_with(ClusterConfig, config, overrides)
    progress = check_flag("progress", progress)
    if config.blend is not None and "token_ids" not in trace.frame.columns:
        raise ValueError(f"blend needs prompt tokens: trace {trace.source!r} has no token_ids column "
                         f"(kvlab.traces.rag makes one)")
    if "output_tokens" not in trace.frame.columns:
        raise ValueError(f"trace {trace.source!r} has no output_tokens column; a timed simulation needs them")
    frame = trace.frame
    times = arrival_times(trace, time_scale=time_scale, rate=rate, seed=config.seed)
    order = np.argsort(times, kind="stable")
    rows = list(zip(frame["request_id"].to_list(), times.tolist(), frame["input_tokens"].to_list(),
                    frame["output_tokens"].to_list()))
    if (np.diff(order) < 0).any():
        raise ValueError(f"trace {trace.source!r} is not in arrival order; sort it by arrival_s first")
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(rows), unit="req", desc="simulate", leave=False)
    try:
        loop = ClusterLoop(rows, PromptSource(trace, config.block_size), config, progress=bar)
        loop.run()
    finally:
        if bar is not None:
            bar.close()
    requests = requests_frame(loop)
    steps = steps_frame(loop)
    return ClusterResult(requests, timeline(steps, loop),
                         summary(trace.source, loop, requests, time_scale=float(time_scale),
                                 rate=None if rate is None else float(rate), block_identity=trace.block_identity),
                         config,
                         steps=steps, transfers=transfers_frame(loop))
