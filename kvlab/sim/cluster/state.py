"""A simulated request's state and counters (cluster_sim.md §6.2)."""

from __future__ import annotations

from kvlab.engines.vllm.request import Request

#: Request states. ``FETCH_KVC``: its tier hit is loading (Opal O22–O23); ``READY``: loaded KV
#: (a fetch, a cache transfer or a P/D handoff) holds blocks, compute not started.
STATES = ("QUEUED_ROUTER", "WAITING", "FETCH_KVC", "READY", "RUNNING", "DONE", "REJECTED")


class SimRequest:
    """One request in flight: the engine's :class:`~kvlab.engines.vllm.request.Request` plus
    the times and counters the ``requests`` frame reports (all times in simulated seconds).

    ``kv_ready_tokens`` is KV a transfer or handoff delivered to the worker: admitted as loaded
    tokens (no compute) when the request is scheduled there.

    >>> r = SimRequest(0, 7, 1.5, 100, 4)
    >>> r.state, r.ttft_s
    ('QUEUED_ROUTER', None)
    """

    __slots__ = ("index", "request_id", "arrival_s", "input_tokens", "output_tokens", "engine", "state",
                 "worker", "decode_worker", "predicted_ttft_s", "rejected", "reject_reason", "enqueue_s",
                 "first_scheduled_s", "fetch_s", "transfer_s", "first_token_s", "last_token_s", "finish_s",
                 "tbt_sum_s", "tbt_max_s", "tbt", "num_output", "gpu_hit_tokens", "tier_hit_blocks",
                 "tier_hit_tokens", "remote_store_tokens", "remote_hit_tokens", "computed_prefill_tokens",
                 "preemptions", "recomputed_tokens", "kv_ready_tokens", "index_columns", "engine_keys", "handoff",
                 "handoff_request", "admitted", "token_ids", "blend", "blend_tokens", "blend_recomputed_tokens",
                 "computed_at_preemption")

    def __init__(self, index: int, request_id: int, arrival_s: float, input_tokens: int, output_tokens: int) -> None:
        self.index = index
        self.request_id = request_id
        self.arrival_s = arrival_s
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.engine: Request | None = None
        self.state = "QUEUED_ROUTER"
        self.worker: int | None = None
        self.decode_worker: int | None = None
        self.predicted_ttft_s: float | None = None
        self.rejected = False
        self.reject_reason = ""
        self.enqueue_s: float | None = None
        self.first_scheduled_s: float | None = None
        self.fetch_s = 0.0
        self.transfer_s = 0.0
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None
        self.finish_s: float | None = None
        self.tbt_sum_s = 0.0
        self.tbt_max_s = 0.0
        self.tbt: list[float] = []
        self.num_output = 0
        self.gpu_hit_tokens = 0
        self.tier_hit_blocks: list[int] | None = None  # per tier, cached lookup (Opal O21)
        self.tier_hit_tokens: list[int] = []
        self.remote_store_tokens = 0  # of its tier hits, tokens read from another worker's segment (C20)
        self.remote_hit_tokens = 0
        self.computed_prefill_tokens = 0
        self.preemptions = 0
        self.recomputed_tokens = 0  # prefill of positions it had computed before a preemption
        self.computed_at_preemption = 0  # the furthest it had computed when preempted
        self.kv_ready_tokens = 0
        self.index_columns: tuple[int, int, int] = (0, 0, 0)
        self.engine_keys: list[int] = []
        self.handoff = False
        self.handoff_request: Request | None = None  # the prefill worker's copy until the handoff is done
        self.admitted = False
        self.token_ids = None  # the prompt's tokens (np.uint32), kept only for CacheBlend
        self.blend = None  # its PrefillSavings on this worker (CacheBlend)
        self.blend_tokens = 0
        self.blend_recomputed_tokens = 0

    @property
    def ttft_s(self) -> float | None:
        """``first_token_s − arrival_s`` (C13), or ``None`` before the first token."""
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s
