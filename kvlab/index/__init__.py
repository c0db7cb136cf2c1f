"""Cluster-global KV block index fed by KV events: backends, event ingestion, faults, scorers.

Models llm-d's ``kvblock`` index and KV-events pool, Opal's KVBM and Dynamo's radix indexer
(docs/specs/index_blend.md Parts A-C); the choices where they disagree (Part E) are in
:mod:`kvlab.index.base` and docs/README.md. Why a fault-free index still under-credits pods
(vLLM's per-copy ``BlockRemoved``, llm-d's unknown-parent rule) and the options that fix
each: docs/index_truth.md.

==================================  ==============================  ===========================================
piece                               models                          in → out
==================================  ==============================  ===========================================
:class:`PodEntry`                   llm-d ``PodEntry`` (L2)         (pod, tier, speculative, group), whole-tuple
:class:`Index`                      llm-d ``Index`` (L4-L10, L16)   the contract every backend keeps
:class:`InMemoryIndex`              llm-d in-memory (L11)           bounded two-level LRU
:class:`RedisIndex`                 llm-d Redis (L13)               a real Redis server, llm-d's key layout
:class:`RadixIndex`                 Dynamo indexer (D2-D7)          radix tree, parent rule, cascade
:class:`EventIngestor`              llm-d event pool (L17-L19)      KV-event batches → index, seq gaps
:class:`DeferredStores`             kvlab (an unknown parent)       stores held until their parent is mapped
:class:`FaultInjector`              Opal coalescing (O8/O26) + net  delay, loss, duplicates, reorder, restarts
:class:`LongestPrefixScorer`        llm-d scorer (L20/L21)          tier-weighted consecutive prefix
:class:`MaxPrefixScorer`            Opal MaxPrefix (O5/O11)         matched fraction, random ties (O12 fixed)
:class:`DynamoCostScorer`           Dynamo selector (D8/D9)         overlap-weighted cost, softmax temperature
:class:`CacheAwareScorer`           SGLang router                   match threshold + load balance
:func:`replay_stream`               a router over an event stream   deliveries → a query's scores per step
:func:`route_requests`              a small cluster                 a trace → routing choices vs the true caches
==================================  ==============================  ===========================================
"""

from kvlab.index.base import DEFAULT_SPECULATIVE_TTL_S, LOOKUP_STOPS, Index, engine_mapping, entry_sort_key
from kvlab.index.cluster import RouteConfig, RouteSummary, route_requests, trace_token_ids
from kvlab.index.deferred import DEFAULT_MAX_DEFERRED, DeferredStores, HeldStore
from kvlab.index.faults import Delivery, DeliveryReplay, FaultInjector
from kvlab.index.ingest import UNKNOWN_PARENT_MODES, EventIngestor, parse_topic
from kvlab.index.ingest_stats import DEFERRED_FATES, EventError, IngestStats, SeqGap
from kvlab.index.local_redis import LocalRedisServer
from kvlab.index.memory import DEFAULT_INDEX_SIZE, DEFAULT_POD_CACHE_SIZE, InMemoryIndex
from kvlab.index.radix import ParentNotFoundError, RadixIndex
from kvlab.index.redis_index import DEFAULT_REDIS_URL, RedisIndex
from kvlab.index.scorers import (
    DEFAULT_TIER_WEIGHTS,
    SCORERS,
    CacheAwareScorer,
    DynamoCostScorer,
    LongestPrefixScorer,
    MaxPrefixScorer,
    Scorer,
    get_scorer,
    request_keys_for_tokens,
)
from kvlab.index.select import PodLoad, dynamo_cost, dynamo_cost_2026, dynamo_select, sglang_imbalanced
from kvlab.index.stream import StreamReplay, replay_stream
from kvlab.index.types import (
    DEFAULT_TIER,
    ENGINE_KEY,
    KEY_TYPES,
    KNOWN_TIERS,
    REQUEST_KEY,
    PodEntry,
    tier_of_medium,
)

__all__ = [
    "DEFAULT_INDEX_SIZE",
    "DEFAULT_MAX_DEFERRED",
    "DEFAULT_POD_CACHE_SIZE",
    "DEFAULT_REDIS_URL",
    "DEFAULT_SPECULATIVE_TTL_S",
    "DEFAULT_TIER",
    "DEFAULT_TIER_WEIGHTS",
    "DEFERRED_FATES",
    "ENGINE_KEY",
    "KEY_TYPES",
    "KNOWN_TIERS",
    "LOOKUP_STOPS",
    "REQUEST_KEY",
    "SCORERS",
    "UNKNOWN_PARENT_MODES",
    "CacheAwareScorer",
    "DeferredStores",
    "Delivery",
    "DeliveryReplay",
    "DynamoCostScorer",
    "EventError",
    "EventIngestor",
    "FaultInjector",
    "InMemoryIndex",
    "HeldStore",
    "Index",
    "IngestStats",
    "LocalRedisServer",
    "LongestPrefixScorer",
    "MaxPrefixScorer",
    "ParentNotFoundError",
    "PodEntry",
    "PodLoad",
    "RadixIndex",
    "RedisIndex",
    "RouteConfig",
    "RouteSummary",
    "Scorer",
    "SeqGap",
    "StreamReplay",
    "dynamo_cost",
    "dynamo_cost_2026",
    "dynamo_select",
    "engine_mapping",
    "entry_sort_key",
    "get_scorer",
    "parse_topic",
    "replay_stream",
    "request_keys_for_tokens",
    "route_requests",
    "sglang_imbalanced",
    "tier_of_medium",
    "trace_token_ids",
]
