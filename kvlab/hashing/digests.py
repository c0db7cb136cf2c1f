"""vLLM's hash functions and NONE_HASH root, shared by the profiles that reuse them.

vLLM 0.33 ``vllm/utils/hashing.py`` (``get_hash_fn_by_name``) and
``kv_cache_utils.init_none_hash`` (docs/specs/hashing.md §1.2–1.3). LMCache reuses both
when vLLM is importable (§4).

=================  ===================================================  ========
algo               serialise                                            digest
=================  ===================================================  ========
``sha256``         ``pickle.dumps(obj, protocol=5)``                    32 B
``sha256_cbor``    ``cbor2.dumps(obj, canonical=True)``                 32 B
``xxhash``         pickle, protocol 5                                   16 B
``xxhash_cbor``    canonical CBOR                                       16 B
=================  ===================================================  ========
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable

import cbor2
import xxhash

from kvlab.core.validate import check_choice, check_str

HASH_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
#: Seed vLLM hashes for NONE_HASH when PYTHONHASHSEED is unset (sha256 algos; PR #51875).
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"


def _pickle5(obj: object) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _cbor(obj: object) -> bytes:
    return cbor2.dumps(obj, canonical=True)


def serializer(algo: str) -> Callable[[object], bytes]:
    """The serialisation step of ``algo`` (pickle protocol 5 or canonical CBOR)."""
    check_algo(algo)
    return _cbor if algo.endswith("_cbor") else _pickle5


def digester(algo: str) -> Callable[[bytes], bytes]:
    """The digest step of ``algo`` on serialised bytes (SHA-256 or XXH3-128)."""
    check_algo(algo)
    if algo.startswith("sha256"):
        return lambda data: hashlib.sha256(data).digest()
    return xxhash.xxh3_128_digest


def hash_fn(algo: str) -> Callable[[object], bytes]:
    """vLLM's ``get_hash_fn_by_name(algo)``: serialise then digest.

    Raises:
        ValueError: unknown algo (lists the known ones).

    Example:
        >>> hash_fn("sha256")("vllm-none-hash").hex()[:16]
        '066b1e8987e02713'
    """
    ser, dig = serializer(algo), digester(algo)
    return lambda obj: dig(ser(obj))


def none_hash(algo: str, seed: str) -> bytes:
    """vLLM's NONE_HASH: ``hash_fn(algo)(seed)``, the parent of every chain's first block.

    Args:
        algo: one of :data:`HASH_ALGOS`.
        seed: the seed *string* (``$PYTHONHASHSEED`` verbatim, or
            :data:`DEFAULT_NONE_HASH_SEED`, or vLLM's random hex for xxhash).

    Raises:
        ValueError: unknown algo or a seed that is not a string.

    Example:
        >>> none_hash("sha256_cbor", DEFAULT_NONE_HASH_SEED).hex()[:16]
        '9bd96a485ad84efd'
    """
    return hash_fn(algo)(check_str("seed", seed))


def check_algo(algo: str) -> str:
    """``algo`` when it is one of :data:`HASH_ALGOS`.

    Raises:
        ValueError: names the known algos and the value.
    """
    return check_choice("algo", algo, HASH_ALGOS)
