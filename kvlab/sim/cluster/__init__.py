"""Timed cluster serving simulation (issue 15; docs/specs/cluster_sim.md §6).

A discrete-event simulation of workers running engine-faithful caches (vLLM v1's
``KVCacheManager`` and scheduling step), tiers with device models, a router over an event-fed
index, and a step-time model — :func:`simulate` returns the shared result type with TTFT, TBT,
E2E, hits per tier and prefill GPU time. Rules C1–C24 are cluster_sim.md §6.9.

=========================  =============================================================
name                       what
=========================  =============================================================
:func:`simulate`           a trace through the cluster → :class:`ClusterResult`
:func:`sweep`              ``simulate`` over a grid of configurations, one row per point, on
                           local processes or a Dask cluster (``docs/sweeps.md``)
:class:`ClusterConfig`     workers, engine limits, time model, tiers, links, router, SLOs
:class:`ClusterTier`       a tier under every worker's GPU cache
:class:`BlendSpec`         CacheBlend (non-prefix chunk reuse) on every worker
:class:`Decision`          a router's answer (worker, decode worker, transfer, reject)
:class:`Router`            ``select(request, view, now)``; :class:`RandomRouter`,
                           :class:`RoundRobin`, :class:`LeastLoaded`, :class:`ScorerRouter`
:class:`Conductor`         Mooncake's Algorithm 1 (C15–C17); ``allow_transfer=False``: local
                           cache-aware; :class:`LoadBalance`: argmin queued prefill seconds
:class:`StepBatch`         one step's prefill chunks ``(n_i, c_i)`` and decode contexts
:class:`StepTime`          ``(step_s, prefill_s)`` of a step (C12)
:class:`Roofline`          per-phase roofline + overheads, BLIS form (C10; default)
:class:`MooncakePrefill`   Mooncake Eq. 1 prefill, memory-bound decode (C11)
:class:`Linear`            ``β0 + β1·miss_tokens + β2·decodes``
:class:`ProfileTable`      interpolation in a measured profile (Vidur / Dynamo style)
:class:`ZeroTime`          0 s per step (C23)
=========================  =============================================================
"""

from kvlab.sim.cluster.blend import BlendSpec
from kvlab.sim.cluster.conductor import Conductor, LoadBalance
from kvlab.sim.cluster.config import ClusterConfig, ClusterTier
from kvlab.sim.cluster.links import Link
from kvlab.sim.cluster.metrics import ClusterResult, ClusterSummary
from kvlab.sim.cluster.profile_table import ProfileTable
from kvlab.sim.cluster.routers import (
    ROUTERS,
    ClusterView,
    Decision,
    LeastLoaded,
    RandomRouter,
    RequestView,
    RoundRobin,
    Router,
    ScorerRouter,
    WorkerLoad,
    get_router,
)
from kvlab.sim.cluster.simulate import arrival_times, simulate
from kvlab.sim.cluster.sweep import sweep
from kvlab.sim.cluster.timing import Linear, MooncakePrefill, Roofline, StepBatch, StepTime, ZeroTime

__all__ = ["ROUTERS", "BlendSpec", "ClusterConfig", "ClusterResult", "ClusterSummary", "ClusterTier",
           "ClusterView", "Conductor", "Decision", "LeastLoaded", "Linear", "Link", "LoadBalance", "MooncakePrefill",
           "ProfileTable", "RandomRouter", "RequestView", "Roofline", "RoundRobin", "Router", "ScorerRouter",
           "StepBatch",
           "StepTime", "WorkerLoad", "ZeroTime", "arrival_times", "get_router", "simulate", "sweep"]
