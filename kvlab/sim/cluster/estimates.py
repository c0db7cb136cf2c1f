"""What a router may estimate before it decides (cluster_sim.md §6.3): a prefill's, a KV
transfer's and a decode step's time, from the cluster's time model and network."""

from __future__ import annotations

import numpy as np

from kvlab.sim.cluster.config import ClusterConfig
from kvlab.sim.cluster.timing import Roofline, StepBatch


class CostEstimates:
    """The time model of a :class:`~kvlab.sim.cluster.config.ClusterConfig` (its ``time_model``, or
    the roofline of its model, GPU and TP) and the estimates :class:`~kvlab.sim.cluster.routers.ClusterView`
    hands to routers.

    Attributes:
        time_model: the step-time model the workers' steps use.
        decode_times: the model's vectorised ``decode_step_times(num_decode, context_sums)``, or
            ``None`` when it has none.

    Example:
        >>> from kvlab.sim.cluster.config import ClusterConfig
        >>> est = CostEstimates(ClusterConfig())
        >>> est.prefill_s(1000, 1000), est.decode_s(0, 0)
        (0.0, 0.0)
        >>> est.prefill_s(1000, 0) > est.prefill_s(1000, 512) > 0
        True
    """

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self.time_model = config.time_model or Roofline(model=config.model_spec, gpu=config.gpu, tp=config.tp)
        self.decode_times = getattr(self.time_model, "decode_step_times", None)

    def prefill_s(self, num_tokens: int, cached_tokens: int) -> float:
        """Seconds of a prefill step computing ``num_tokens - cached_tokens`` tokens (0 when all cached)."""
        if num_tokens <= cached_tokens:
            return 0.0
        return self.time_model.step_time(StepBatch(prefill=[(num_tokens - cached_tokens, cached_tokens)])).step_s

    def transfer_s(self, num_blocks: int) -> float:
        """Seconds to read ``num_blocks`` blocks over the cluster network (one operation)."""
        size = num_blocks * self.config.block_bytes
        return self.config.network.read_time_s(size, num_ops=1 if size else 0)

    def decode_s(self, num_decode: int, context_tokens: int) -> float:
        """Seconds of a decode step of ``num_decode`` requests holding ``context_tokens`` in all."""
        if num_decode == 0:
            return 0.0
        if self.decode_times is not None:
            return float(self.decode_times(num_decode, np.array([context_tokens]))[0])
        each, extra = divmod(context_tokens, num_decode)
        return self.time_model.step_time(StepBatch(decode=[each + (k < extra) for k in range(num_decode)])).step_s
