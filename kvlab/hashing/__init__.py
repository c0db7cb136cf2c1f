"""Block hashing: tokens → chained block keys, one profile per engine.

Every profile is a :class:`BlockHasher`: ``block_hashes(tokens, extras)`` gives the
engine's native hashes, ``block_keys(tokens, extras)`` their ``uint64`` form — the key a
:class:`~kvlab.traces.Trace` stores. docs/specs/hashing.md gives each scheme exactly;
``tests/vectors`` pins them against the released engines.

==================  ==================  ====================================  ============
factory             engine              block key (u64)                       partial tail
==================  ==================  ====================================  ============
:func:`vllm`        vLLM 0.33           KV-event id (last 8 digest bytes)     no
:func:`llmd`        llm-d kv-cache      request key (FNV-64a over CBOR)       no
:func:`dynamo`      Dynamo KV router    sequence hash (xxh3-64 chain)         no
:func:`lmcache`     LMCache 0.5.6       chunk hash as an integer              configurable
:func:`sglang`      SGLang 0.5.23       page SHA-256, first 8 bytes signed    yes
:func:`sim`         kvlab               :func:`chain_u64` (numba)             configurable
==================  ==================  ====================================  ============

No two engines share a key for the same prompt: their hash functions, roots and
serialisations all differ (the ``02_hashing`` notebook shows it). :class:`RequestExtras`
describes a request's LoRA, multimodal items, cache salt and prompt embeddings once for
all profiles; each uses what its engine hashes.
"""

from __future__ import annotations

from kvlab.core.validate import check_choice
from kvlab.hashing.base import (
    NO_EXTRAS,
    BlockHash,
    BlockHasher,
    MMItem,
    RequestExtras,
    coarse_view,
    normalize_engine_hash,
)
from kvlab.hashing.dynamo_hash import DynamoHasher, mm_hash_from_identifier, storage_tier_from_medium
from kvlab.hashing.llmd_hash import EngineKeyMap, LlmdHasher, map_engine_to_request_keys
from kvlab.hashing.lmcache_hash import LMCacheHasher
from kvlab.hashing.sglang_hash import SGLangHasher
from kvlab.hashing.sim_hash import SimHasher, chain_u64, chain_u64_batch
from kvlab.hashing.vllm_hash import VllmHasher, VllmIncrementalHasher


def vllm(algo: str = "sha256", seed: str | None = None, *, block_size: int = 16, rng=None) -> VllmHasher:  # noqa: ANN001
    """vLLM v1 prefix-caching hashes (:class:`VllmHasher`); ``seed`` has PYTHONHASHSEED semantics.

    Example:
        >>> vllm().block_keys(range(32)).shape
        (2,)
    """
    return VllmHasher(algo=algo, block_size=block_size, seed=seed, rng=rng)


def llmd(block_size: int = 16, hash_seed: str = "", model_name: str = "") -> LlmdHasher:
    """llm-d kv-cache request keys (:class:`LlmdHasher`)."""
    return LlmdHasher(block_size=block_size, hash_seed=hash_seed, model_name=model_name)


def dynamo(block_size: int, *, is_eagle: bool = False) -> DynamoHasher:
    """Dynamo KV-router block hashes (:class:`DynamoHasher`); block keys are sequence hashes."""
    return DynamoHasher(block_size=block_size, is_eagle=is_eagle)


def lmcache(chunk_size: int = 256, mode: str = "chunked_token_db", **options: object) -> LMCacheHasher:
    """LMCache chunk hashes (:class:`LMCacheHasher`); ``options`` as its constructor's."""
    return LMCacheHasher(chunk_size=chunk_size, mode=mode, **options)


def sglang(page_size: int, *, event_format: str = "default") -> SGLangHasher:
    """SGLang page hashes (:class:`SGLangHasher`)."""
    return SGLangHasher(page_size=page_size, event_format=event_format)


def sim(block_size: int, seed: int = 0, *, partial_tail: bool = False) -> SimHasher:
    """kvlab's fast simulation hash (:class:`SimHasher` over :func:`chain_u64`)."""
    return SimHasher(block_size, seed, partial_tail=partial_tail)


#: Profile factories by name.
PROFILES = {"vllm": vllm, "llmd": llmd, "dynamo": dynamo, "lmcache": lmcache, "sglang": sglang, "sim": sim}


def get_hasher(name: str, **params: object) -> BlockHasher:
    """Build a profile by name, e.g. ``get_hasher("dynamo", block_size=64)``.

    Raises:
        ValueError: unknown name (lists the known ones) or an invalid parameter.

    Example:
        >>> get_hasher("llmd", block_size=4).name
        'llmd'
    """
    check_choice("profile", name, sorted(PROFILES))
    try:
        return PROFILES[name](**params)
    except TypeError as err:  # an unknown keyword
        raise ValueError(f"profile {name!r}: {err}") from None


__all__ = [
    "NO_EXTRAS",
    "PROFILES",
    "BlockHash",
    "BlockHasher",
    "DynamoHasher",
    "EngineKeyMap",
    "LMCacheHasher",
    "LlmdHasher",
    "MMItem",
    "RequestExtras",
    "SGLangHasher",
    "SimHasher",
    "VllmHasher",
    "VllmIncrementalHasher",
    "chain_u64",
    "chain_u64_batch",
    "coarse_view",
    "dynamo",
    "get_hasher",
    "llmd",
    "lmcache",
    "map_engine_to_request_keys",
    "mm_hash_from_identifier",
    "normalize_engine_hash",
    "sglang",
    "sim",
    "storage_tier_from_medium",
    "vllm",
]
