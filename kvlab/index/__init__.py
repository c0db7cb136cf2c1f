"""Cluster-global KV block index fed by KV events: backends, event ingestion, faults, scorers.

Models llm-d's ``kvblock`` index and KV-events pool, Opal's KVBM and Dynamo's radix indexer
(docs/specs/index_blend.md Parts A-C).
"""

from kvlab.index.base import DEFAULT_SPECULATIVE_TTL_S, LOOKUP_STOPS, Index, engine_mapping, entry_sort_key
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
    "DEFAULT_SPECULATIVE_TTL_S",
    "DEFAULT_TIER",
    "ENGINE_KEY",
    "KEY_TYPES",
    "KNOWN_TIERS",
    "LOOKUP_STOPS",
    "REQUEST_KEY",
    "Index",
    "PodEntry",
    "engine_mapping",
    "entry_sort_key",
    "tier_of_medium",
]
