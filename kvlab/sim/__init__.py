"""Simulation: cache-level replay of traces through prefix caches.

=========================  ======================================================================
name                       what
=========================  ======================================================================
:func:`replay`             one trace through one cache → a :class:`kvlab.core.RunResult`
:func:`sweep`              a grid of capacities × policies → one row per run, in parallel on
                           threads, processes or Dask (:mod:`kvlab.sim.executors`)
:func:`mrc`                LRU hit ratio at every capacity in one pass (Mattson; SHARDS sampling)
:func:`replay_reference`   plain-Python replay over a policy's reference class (oracle)
:mod:`kvlab.sim.kernel`    the numba driver shared by every policy
=========================  ======================================================================
"""

from kvlab.sim.mrc import mrc  # noqa: E402 - after sweep, whose schema it reuses
from kvlab.sim.reference import ReferenceSummary, replay_reference
from kvlab.sim.replay import TOUCH_ORDERS, ReplayConfig, ReplaySummary, replay
from kvlab.sim.sweep import sweep

__all__ = [
    "TOUCH_ORDERS",
    "ReferenceSummary",
    "ReplayConfig",
    "ReplaySummary",
    "mrc",
    "replay",
    "replay_reference",
    "sweep",
]
