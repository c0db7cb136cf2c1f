"""Tiered KV storage (GPU / CPU / NVMe / remote): device models, model shapes, load-vs-recompute cost.

=====================================  ==========================  ==============================================
piece                                  what it cares about         in → out
=====================================  ==========================  ==============================================
:class:`Device`, ``DEVICES``           one tier's device or link   bytes, ops → seconds (latency, bandwidth, slots)
:class:`ModelSpec`, ``MODELS``         one model's KV and FLOPs    tokens → KV bytes, blocks per capacity, FLOPs
``GPU_FLOPS``                          GPU compute                 name → dense BF16 FLOP/s
``GPU_HBM_BYTES_PER_S``                GPU memory                  name → peak HBM bytes/s
``cost``: :func:`load_or_recompute`    load or recompute           blocks, tier, GPU → fetch / recompute seconds
:func:`ttft_saved_s`                   hits over several tiers     per-tier hit blocks → prefill seconds saved
:func:`mooncake_break_even_bandwidth`  Mooncake FAST'25 Eq. 2      prefix length, model, GPUs → bytes/s
:func:`tokens_to_load`                 LMCache connector (L4)      local hit, tier hit → tokens to onboard
:class:`TieredStore`                  tiers, write policy, pins   requests → hit tiers, moves, counters, events
:func:`replay_tiered`                  a trace through tiers       numba driver (a policy state per tier) or the
                                                                   store → :class:`TieredReplayResult`
:class:`TieredConfig`                  a tiered configuration      :class:`TierSpec` per tier, write policy …
                                                                   (checked on construction)
:class:`Tier`                          one tier                    capacity + policy plug-in + pins + counters
:class:`TierEvent`                     what a store publishes      state changes → vLLM KV events (``medium``)
=====================================  ==========================  ==============================================

Numbers come from docs/specs/engines.md §8 and Opal's defaults (docs/specs/index_blend.md
§B.4, §B.6); each preset cites its source.
"""

from kvlab.tiers.cost import (
    LoadOrRecompute,
    TierHit,
    fetch_time_s,
    load_or_recompute,
    mooncake_break_even_bandwidth,
    mooncake_prefill_flops,
    offload_time_s,
    recompute_time_s,
    tokens_to_load,
    ttft_saved_s,
)
from kvlab.tiers.devices import DEVICES, Device, get_device
from kvlab.tiers.events import TierEvent, apply_kv_events, to_kv_events
from kvlab.tiers.models import (
    GPU_FLOPS,
    GPU_HBM_BYTES_PER_S,
    MODELS,
    ModelSpec,
    get_gpu_flops,
    get_gpu_hbm_bytes_per_s,
    get_model,
)
from kvlab.tiers.replay import replay_tiered
from kvlab.tiers.result import TieredReplayResult, TieredSummary, TierSummary
from kvlab.tiers.store import TieredStore
from kvlab.tiers.tier import Tier, TierCounters
from kvlab.tiers.types import WRITE_POLICIES, LookupResult, TieredConfig, TierSpec

__all__ = [
    "DEVICES",
    "GPU_FLOPS",
    "GPU_HBM_BYTES_PER_S",
    "MODELS",
    "Device",
    "LoadOrRecompute",
    "LookupResult",
    "ModelSpec",
    "Tier",
    "TierCounters",
    "TierEvent",
    "TierHit",
    "TierSpec",
    "TierSummary",
    "TieredConfig",
    "TieredReplayResult",
    "TieredStore",
    "TieredSummary",
    "WRITE_POLICIES",
    "apply_kv_events",
    "fetch_time_s",
    "get_device",
    "get_gpu_flops",
    "get_gpu_hbm_bytes_per_s",
    "get_model",
    "load_or_recompute",
    "mooncake_break_even_bandwidth",
    "mooncake_prefill_flops",
    "offload_time_s",
    "recompute_time_s",
    "replay_tiered",
    "to_kv_events",
    "tokens_to_load",
    "ttft_saved_s",
]
