"""Timed cluster serving simulation (issue 15; docs/specs/cluster_sim.md §6).

So far: the step-time models of §6.5 (:mod:`kvlab.sim.cluster.timing`,
:mod:`kvlab.sim.cluster.profile_table`).

=========================  =============================================================
name                       what
=========================  =============================================================
:class:`StepBatch`         one step's prefill chunks ``(n_i, c_i)`` and decode contexts
:class:`StepTime`          ``(step_s, prefill_s)`` of a step (C12)
:class:`Roofline`          per-phase roofline + overheads, BLIS form (C10; default)
:class:`MooncakePrefill`   Mooncake Eq. 1 prefill, memory-bound decode (C11)
:class:`Linear`            ``β0 + β1·miss_tokens + β2·decodes``
:class:`ProfileTable`      interpolation in a measured profile (Vidur / Dynamo style)
:class:`ZeroTime`          0 s per step (C23)
=========================  =============================================================
"""

from kvlab.sim.cluster.profile_table import ProfileTable
from kvlab.sim.cluster.timing import Linear, MooncakePrefill, Roofline, StepBatch, StepTime, ZeroTime

__all__ = ["Linear", "MooncakePrefill", "ProfileTable", "Roofline", "StepBatch", "StepTime", "ZeroTime"]
