"""Mooncake's Conductor (FAST'25 Algorithm 1) and its baselines as cluster routers (cluster_sim.md
§6.6, rules C15–C17, C21; engines.md §5.3 M4).

==========================  ===========================================================
router                      rule
==========================  ===========================================================
:class:`Conductor`          argmin ``T_transfer + T_queue + T_prefill``, copying the best
                            worker's prefix when it is ``kvcache_balancing_threshold`` times
                            longer than the worker's own (global cache-aware)
``Conductor(allow_transfer=False)``  the same without copies (local cache-aware)
:class:`LoadBalance`        argmin ``T_queue`` (the paper's "load balancing")
==========================  ===========================================================

``T_queue`` is :attr:`~kvlab.sim.cluster.routers.WorkerLoad.queued_prefill_s` from the load
signal (stale between snapshots, C18); prefix lengths come from the event-fed index (stale
through the fault injector); ``T_prefill`` and ``T_transfer`` from the view's time model and
network device.
"""

from __future__ import annotations

from kvlab.core.validate import check_flag, check_real
from kvlab.sim.cluster.routers import ROUTERS, ClusterView, Decision, RequestView, Router


class Conductor(Router):
    """Mooncake's KVCache-centric prefill scheduler (FAST'25 Algorithm 1; C15–C17).

    For each routable worker ``w``: ``prefix_w`` = the index's prefix length (blocks);
    ``best_len, best_w`` = the longest (ties: lowest index). If transfers are allowed, ``w`` is
    not ``best_w`` and ``best_len / max(prefix_w, 1) > kvcache_balancing_threshold``, the
    prefix is copied first: ``prefix = best_len``, ``T_transfer`` = the network's read time of
    the ``best_len − prefix_w`` blocks; else ``prefix = prefix_w``, ``T_transfer = 0``.
    ``T_queue`` = the worker's ``queued_prefill_s``; ``T_prefill`` = the time model's prefill of
    the prompt less ``prefix`` blocks (at most the blocks before the last token, which is always
    computed). The worker with the smallest ``TTFT = T_transfer + T_queue + T_prefill`` wins
    (ties: lowest index); the decision carries the copy and the predicted TTFT.

    Args:
        kvcache_balancing_threshold: the prefix-length ratio above which a copy is considered
            (the paper's manual knob; > 0).
        allow_transfer: ``False`` is "local cache-aware" (C21): only a worker's own prefix.
        ttft_slo_s: reject (HTTP 429: a ``rejected`` row) when the predicted TTFT exceeds it.
        tbt_slo_s: reject when the predicted TBT exceeds it: one decode step of the decode
            worker with the smallest prediction (P/D; then named in the decision) or of the chosen
            worker, over its requests (on their way, waiting, running) and this one, the context
            ≈ its used blocks + its queued prefill tokens + the prompt.

    Raises:
        ValueError: a threshold or SLO not a positive real, a flag not a bool.

    >>> Conductor().name, Conductor(allow_transfer=False).name
    ('conductor', 'local_cache_aware')
    """

    uses_index = True

    def __init__(self, kvcache_balancing_threshold: float = 1.5, allow_transfer: bool = True,
                 ttft_slo_s: float | None = None, tbt_slo_s: float | None = None) -> None:
        self.kvcache_balancing_threshold = check_real("kvcache_balancing_threshold", kvcache_balancing_threshold,
                                                      low=0.0, low_open=True)
        self.allow_transfer = check_flag("allow_transfer", allow_transfer)
        self.ttft_slo_s = check_real("ttft_slo_s", ttft_slo_s, low=0.0, low_open=True, optional=True)
        self.tbt_slo_s = check_real("tbt_slo_s", tbt_slo_s, low=0.0, low_open=True, optional=True)
        self.name = "conductor" if self.allow_transfer else "local_cache_aware"

    def to_dict(self) -> dict[str, object]:
        """Type, name and options."""
        return {**super().to_dict(), "kvcache_balancing_threshold": self.kvcache_balancing_threshold,
                "allow_transfer": self.allow_transfer, "ttft_slo_s": self.ttft_slo_s, "tbt_slo_s": self.tbt_slo_s}

    def predict(self, request: RequestView, view: ClusterView) -> list[tuple[float, int, str | None]]:
        """Per routable worker, in order: ``(predicted TTFT s, prefix blocks after any copy,
        the worker copied from or None)``."""
        loads = view.loads()
        bs = view.block_size
        limit = max(request.input_tokens - 1, 0) // bs  # vLLM computes the last token
        prefixes = [view.prefix_blocks(request, w) for w in view.workers]
        best_len = max(prefixes, default=0)
        best = prefixes.index(best_len) if prefixes else 0
        out = []
        for k, (w, prefix_w) in enumerate(zip(view.workers, prefixes, strict=True)):
            prefix, source, t_transfer = prefix_w, None, 0.0
            if (self.allow_transfer and k != best
                    and best_len / max(prefix_w, 1) > self.kvcache_balancing_threshold
                    and min(best_len, limit) > prefix_w):
                prefix, source = best_len, view.workers[best]
                t_transfer = view.estimate_transfer_s(min(best_len, limit) - prefix_w)
            t_prefill = view.estimate_prefill_s(request.input_tokens, min(prefix, limit) * bs)
            out.append((t_transfer + loads[w].queued_prefill_s + t_prefill, prefix, source))
        return out

    def select(self, request: RequestView, view: ClusterView, now: float) -> Decision:  # noqa: ARG002
        """Algorithm 1: the argmin of predicted TTFT, its copy, and the SLO checks."""
        predictions = self.predict(request, view)
        k = min(range(len(predictions)), key=lambda j: predictions[j][0])
        ttft, prefix, source = predictions[k]
        worker = view.workers[k]
        reject = self.ttft_slo_s is not None and ttft > self.ttft_slo_s
        decode = None
        if self.tbt_slo_s is not None:
            loads = view.loads()
            pool = view.decode_workers or [worker]
            tbt = {d: view.estimate_decode_s(loads[d].requests + 1, loads[d].used_blocks * view.block_size
                                             + loads[d].queued_prefill_tokens + request.input_tokens)
                   for d in pool}
            best_decode = min(pool, key=tbt.__getitem__)
            decode = best_decode if view.decode_workers else None
            reject = reject or tbt[best_decode] > self.tbt_slo_s
        return Decision(worker, decode_worker=decode, transfer_from=source, transfer_blocks=prefix if source else 0,
                        reject=reject, predicted_ttft_s=ttft)


class LoadBalance(Router):
    """The smallest predicted queue: argmin ``T_queue`` (:attr:`~kvlab.sim.cluster.routers.
    WorkerLoad.queued_prefill_s`, ties: lowest index) — Mooncake §5.3's "load balancing" (C21),
    queued prefill seconds rather than :class:`~kvlab.sim.cluster.routers.LeastLoaded`'s
    request count.

    >>> LoadBalance().name
    'load_balance'
    """

    name = "load_balance"

    def select(self, request: RequestView, view: ClusterView, now: float) -> Decision:  # noqa: ARG002
        """The argmin of queued prefill seconds."""
        loads = view.loads()
        return Decision(min(view.workers, key=lambda w: loads[w].queued_prefill_s))


def _local_cache_aware() -> Conductor:
    """Conductor with copies forbidden (C21)."""
    return Conductor(allow_transfer=False)


ROUTERS.update(conductor=Conductor, local_cache_aware=_local_cache_aware, load_balance=LoadBalance)
