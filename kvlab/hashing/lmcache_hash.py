"""LMCache 0.5.6 chunk hashing: the in-process ``ChunkedTokenDatabase`` and the
multiprocess server's ``TokenHasher`` (docs/specs/hashing.md §4).

LMCache keys KV by *chunks* of ``chunk_size`` tokens (default 256), chained like vLLM's
blocks but with its own tuple shape, so its keys never equal vLLM's::

    chunked_token_db (lmcache/v1/token_database.py, §4.1)
        prefix_0 = NONE_HASH                  int: first 8 bytes of vLLM's NONE_HASH, BE
                                              (0 when vLLM is not importable)
        prefix_i = normalize( H((prefix_{i-1}, tuple(chunk_i), ())) )
        normalize(bytes) = int.from_bytes(digest[:8], "big")   (FIRST 8 bytes)
        H = vLLM get_hash_fn_by_name(algo), or Python's hash() for "builtin"

    mp_token_hasher (lmcache/v1/multiprocess/token_hasher.py, §4.2)
        blake3:  h_i = blake3( h_{i-1} ‖ pack(">%dI", *chunk_i) ),  h_{-1} = blake3(12 zero bytes)
        vLLM algo: h_i = H((h_{i-1}, tuple(chunk_i), None)),  h_{-1} = vLLM NONE_HASH
        (sha256_cbor here *is* vLLM's block hash at block size = chunk size); full chunks only

Multimodal: LMCache derives keys from token ids only; its vLLM connector first overwrites
every MM item's placeholder span with values derived from the item's identifier
(:func:`apply_mm_placeholders`).
"""

from __future__ import annotations

import hashlib
import string
import warnings
from collections.abc import Sequence

import blake3
import numpy as np

from kvlab.core.validate import check_choice, check_count, check_flag, check_int, check_str
from kvlab.hashing.base import (
    U64_MASK,
    BlockHasher,
    MMItem,
    RequestExtras,
    as_token_array,
    check_block_size,
    resolve_extras,
    u64_from_bytes_last8,
    u64_from_signed,
)
from kvlab.hashing.digests import DEFAULT_NONE_HASH_SEED, HASH_ALGOS, hash_fn, none_hash

MODES = ("chunked_token_db", "mp_token_hasher")
#: ``pre_caching_hash_algorithm`` values of the in-process connector.
CHUNKED_ALGOS = ("builtin", *HASH_ALGOS)
#: ``hash_algorithm`` values of the multiprocess server.
MP_ALGOS = ("blake3", *HASH_ALGOS)
_DEFAULT_ALGO = {"chunked_token_db": "sha256_cbor", "mp_token_hasher": "blake3"}
MM_PLACEHOLDER_MODES = ("per_position", "int16_legacy")
#: The multiprocess server's blake3 root: ``blake3(0 as 8 signed BE bytes ‖ pack(">I", 0))``.
MP_BLAKE3_NONE_HASH = blake3.blake3(bytes(12)).digest()
_U32_MAX = (1 << 32) - 1
_INT31_MASK = (1 << 31) - 1


def hex_hash_to_int16(identifier: str) -> int:
    """An MM identifier reduced to 16 bits — LMCache's pre-fix placeholder value.

    Models ``lmcache.integration.mm_utils.hex_hash_to_int16`` (before LMCache PR #4783):
    the stripped identifier, ``0x`` prefix allowed, is read as hex and masked to its
    last 4 hex digits; a non-hex identifier gives the first 2 bytes of its SHA-256
    (big-endian). Two images whose digests share their last 4 hex digits get the same
    value (LMCache issues #3301, #4086).

    Raises:
        ValueError: ``identifier`` is not a string.

    Example:
        >>> hex_hash_to_int16("0x123456"), hex_hash_to_int16(" FfFf ")
        (13398, 65535)
    """
    stripped = check_str("identifier", identifier).strip()
    hex_part = stripped[2:] if stripped.lower().startswith("0x") else stripped
    if hex_part and all(c in string.hexdigits for c in hex_part):
        return int(hex_part, 16) & 0xFFFF
    return int.from_bytes(hashlib.sha256(stripped.encode("utf-8")).digest()[:2], "big")


def mm_placeholder_values(identifier: str, length: int) -> list[int]:
    """``length`` placeholder values in ``[0, 2**31)``, one per position, from the full identifier.

    The fix merged as LMCache PR #4783 (``mm_hash_to_token_values``) gives every
    placeholder position its own 31-bit value expanded from the whole identifier with
    SHA-256 in counter mode (prefix-stable: ``values(x, m) == values(x, n)[:m]``). The
    exact expansion below is **kvlab's reading of the fix's description** — no upstream
    vector exists: block ``k`` is ``sha256(utf8(identifier) ‖ k as 8 bytes BE)``, cut
    into eight big-endian 32-bit words; position ``i`` takes word ``i`` of the stream
    with its top bit cleared.

    Raises:
        ValueError: ``identifier`` not a string, or ``length`` not an integer >= 0.

    Example:
        >>> values = mm_placeholder_values("img", 10)
        >>> values[:3] == mm_placeholder_values("img", 3), all(0 <= v < 2**31 for v in values)
        (True, True)
    """
    data = check_str("identifier", identifier).encode("utf-8")
    length = check_count("length", length)
    stream = b"".join(hashlib.sha256(data + k.to_bytes(8, "big")).digest() for k in range(-(-length // 8)))
    return (np.frombuffer(stream, dtype=">u4")[:length] & _INT31_MASK).tolist()


def apply_mm_placeholders(token_ids: Sequence[int] | np.ndarray, mm_items: Sequence[MMItem],
                          mm_placeholder: str = "per_position") -> np.ndarray:
    """Token ids with every MM item's placeholder span overwritten, as LMCache's vLLM
    connector does before chunk hashing (``apply_mm_hashes_to_token_ids``).

    Spans are truncated at the end of ``token_ids`` and items starting beyond it are
    skipped (LMCache hashes prompt prefixes on its save path); a later item overwrites
    an earlier one where spans overlap.

    Args:
        token_ids: ``int[n]`` token ids.
        mm_items: the request's items, applied in offset order.
        mm_placeholder: ``"per_position"`` (:func:`mm_placeholder_values`, PR #4783) or
            ``"int16_legacy"`` (one :func:`hex_hash_to_int16` value over the whole span).

    Returns:
        A new ``int64[n]`` (``uint64[n]`` for uint64 input) array.

    Raises:
        ValueError: bad token ids, an item that is not an :class:`MMItem`, or an
            unknown ``mm_placeholder``.

    Example:
        >>> apply_mm_placeholders([7, 7, 7, 7], [MMItem("0xabcd", 1, 2)], "int16_legacy").tolist()
        [7, 43981, 43981, 7]
    """
    check_choice("mm_placeholder", mm_placeholder, MM_PLACEHOLDER_MODES)
    if not all(isinstance(item, MMItem) for item in mm_items):
        raise ValueError(f"mm_items must be MMItem values, got {mm_items!r}")
    tokens = as_token_array(token_ids).copy()
    n = tokens.shape[0]
    for item in sorted(mm_items, key=lambda it: it.offset):
        if item.offset >= n:
            continue
        end = min(item.end, n)
        if mm_placeholder == "per_position":
            tokens[item.offset:end] = mm_placeholder_values(item.identifier, end - item.offset)
        else:
            tokens[item.offset:end] = hex_hash_to_int16(item.identifier)
    return tokens


def normalize_hash_to_int(value: bytes | int) -> int:
    """LMCache's ``_normalize_hash_to_int``: a digest's FIRST 8 bytes, big-endian,
    unsigned; an int (Python ``hash()``) is kept.

    Note vLLM's event form takes the *last* 8 bytes (docs/specs/hashing.md §1.7, §4.1).

    Example:
        >>> normalize_hash_to_int(bytes(range(16))), normalize_hash_to_int(-5)
        (283686952306183, -5)
    """
    return int.from_bytes(value[:8], "big") if isinstance(value, bytes) else value


class LMCacheHasher(BlockHasher):
    """LMCache 0.5.6 chunk keys (docs/specs/hashing.md §4) as a :class:`BlockHasher` profile.

    Two modes, named ``"lmcache.<mode>.<algo>"`` like the golden vectors:

    * ``"chunked_token_db"`` — the in-process connector's ``ChunkedTokenDatabase``
      (``_hash_tokens``, ``_prefix_hash``, ``process_tokens``): native hashes are ``int``
      (first 8 digest bytes, or Python ``hash()`` for ``"builtin"``, possibly negative);
      :meth:`to_u64` is their two's complement. ``save_unfull_chunk`` hashes the partial
      last chunk too.
    * ``"mp_token_hasher"`` — the multiprocess server's ``TokenHasher.compute_chunk_hashes``:
      native hashes are the digest ``bytes`` (32 B, 16 B for xxhash); :meth:`to_u64` is
      their last 8 bytes big-endian, what LMCache publishes in vLLM KV events
      (``lmcache_mp_connector._convert_kv_event_hash``). Full chunks only.

    LMCache chunk keys depend on token ids only: ``lora_name``, ``lora_path``,
    ``lora_identity``, ``cache_salt`` and ``prompt_embeds`` of :class:`RequestExtras` do
    not enter them (as in LMCache, where the model name sits in ``CacheEngineKey``
    instead); ``mm_items`` rewrite the placeholder tokens first (:func:`apply_mm_placeholders`).

    **"builtin" is Python's hash() and is bound to the process**: chunk hashes of int
    tuples are reproducible on one interpreter build (the golden vectors: CPython 3.11,
    64-bit), but with ``vllm_importable=True`` the root is ``hash(seed_string)``, which
    CPython randomises per process unless ``PYTHONHASHSEED`` is set — the value then
    matches an LMCache process only if *this* process runs with the same
    ``PYTHONHASHSEED`` (and ``none_hash_seed`` is that same string, as vLLM reads it).

    Args:
        chunk_size: tokens per chunk (LMCache default 256).
        mode: ``"chunked_token_db"`` or ``"mp_token_hasher"``.
        algo: ``chunked_token_db``: one of :data:`CHUNKED_ALGOS` (default
            ``"sha256_cbor"``; LMCache's own default ``pre_caching_hash_algorithm`` is
            ``"builtin"``, process-bound, so kvlab does not default to it);
            ``mp_token_hasher``: one of :data:`MP_ALGOS` (default ``"blake3"``, LMCache's).
        save_unfull_chunk: hash a trailing partial chunk (``chunked_token_db`` only;
            LMCache's config default is False).
        vllm_importable: whether vLLM is importable in the LMCache process: the root is
            then vLLM's NONE_HASH, else 0 (``chunked_token_db``). ``mp_token_hasher``
            with a vLLM algo needs it (without vLLM LMCache falls back to ``hash()``).
        none_hash_seed: the NONE_HASH seed string (``$PYTHONHASHSEED`` verbatim in the
            modelled process); ``None`` means unset: ``"vllm-none-hash"`` for the sha256
            algos and "builtin"; the xxhash algos then use a random seed in vLLM, so one
            must be given. Only allowed where a vLLM NONE_HASH is the root.
        mm_placeholder: ``"per_position"`` (LMCache PR #4783; default) or
            ``"int16_legacy"`` (older releases; reproduces the collision of issue #3301).

    Attributes:
        none_hash: the chain root, in the mode's native form (``NONE_HASH`` / ``none_hash``).

    Raises:
        ValueError: any parameter outside the above, naming it and the value.

    Example:
        >>> lm = LMCacheHasher(chunk_size=4)
        >>> lm.name, lm.block_hashes(list(range(1, 14)))[0]
        ('lmcache.chunked_token_db.sha256_cbor', 5919234735220982235)
        >>> mp = LMCacheHasher(chunk_size=4, mode="mp_token_hasher")
        >>> mp.block_hashes(list(range(1, 14)))[0].hex()[:16], len(mp.block_keys(range(1, 14)))
        ('6309ed506b872190', 3)
    """

    def __init__(self, *, chunk_size: int = 256, mode: str = "chunked_token_db", algo: str | None = None,
                 save_unfull_chunk: bool = False, vllm_importable: bool = True,
                 none_hash_seed: str | None = None, mm_placeholder: str = "per_position") -> None:
        self.block_size = check_block_size(chunk_size, "chunk_size")
        check_choice("mode", mode, MODES)
        algos = CHUNKED_ALGOS if mode == "chunked_token_db" else MP_ALGOS
        algo = check_choice(f"algo for mode {mode!r}", _DEFAULT_ALGO[mode] if algo is None else algo, algos)
        save_unfull_chunk = check_flag("save_unfull_chunk", save_unfull_chunk)
        vllm_importable = check_flag("vllm_importable", vllm_importable)
        check_choice("mm_placeholder", mm_placeholder, MM_PLACEHOLDER_MODES)
        check_str("none_hash_seed", none_hash_seed, optional=True)
        if mode == "mp_token_hasher":
            if save_unfull_chunk:
                raise ValueError("save_unfull_chunk=True is not available with mode 'mp_token_hasher' "
                                 "(TokenHasher.compute_chunk_hashes hashes full chunks only)")
            if algo != "blake3" and not vllm_importable:
                raise ValueError(f"mode 'mp_token_hasher' with algo {algo!r} needs vllm_importable=True "
                                 "(without vLLM, LMCache falls back to Python's hash(), not modelled)")
        uses_vllm_root = vllm_importable and algo != "blake3"
        if none_hash_seed is not None and not uses_vllm_root:
            raise ValueError(f"none_hash_seed={none_hash_seed!r} is unused with mode {mode!r}, algo {algo!r}, "
                             f"vllm_importable={vllm_importable} (the root is fixed)")
        if uses_vllm_root and none_hash_seed is None and algo.startswith("xxhash"):
            raise ValueError(f"algo {algo!r} needs an explicit none_hash_seed: with PYTHONHASHSEED unset vLLM "
                             "seeds NONE_HASH from os.urandom, so the keys are not reproducible")
        self.mode, self.algo, self.mm_placeholder = mode, algo, mm_placeholder
        self.vllm_importable, self.none_hash_seed = vllm_importable, none_hash_seed
        self.hashes_partial_tail = save_unfull_chunk
        self.name = f"lmcache.{mode}.{algo}"
        if algo == "builtin":
            warnings.warn("LMCache 'builtin' chunk hashes are Python hash() values: bound to this process "
                          "(PYTHONHASHSEED) and interpreter; never compare them across processes",
                          UserWarning, stacklevel=2)
        seed = DEFAULT_NONE_HASH_SEED if none_hash_seed is None else none_hash_seed
        self.none_hash: int | bytes
        if mode == "mp_token_hasher":
            self.none_hash = MP_BLAKE3_NONE_HASH if algo == "blake3" else none_hash(algo, seed)
        elif not vllm_importable:
            self.none_hash = 0
        else:
            self.none_hash = hash(seed) if algo == "builtin" else normalize_hash_to_int(none_hash(algo, seed))

    def _hash_chunk(self, prefix: int | bytes, chunk: np.ndarray) -> int | bytes:
        if self.mode == "chunked_token_db":
            payload = (prefix, tuple(chunk.tolist()), ())
            return hash(payload) if self.algo == "builtin" else normalize_hash_to_int(hash_fn(self.algo)(payload))
        if self.algo == "blake3":
            return blake3.blake3(prefix + chunk.astype(">u4").tobytes()).digest()
        return hash_fn(self.algo)((prefix, tuple(chunk.tolist()), None))

    def block_hashes(self, token_ids: Sequence[int] | np.ndarray,
                     extras: RequestExtras | None = None) -> list[int] | list[bytes]:
        """Chained chunk hashes in LMCache's native form: ``int`` (``chunked_token_db``)
        or digest ``bytes`` (``mp_token_hasher``), one per full chunk (plus the partial
        last chunk when ``save_unfull_chunk``).

        Args:
            token_ids: ``int[n]`` prompt token ids.
            extras: only ``mm_items`` are used (placeholder spans rewritten first).

        Raises:
            ValueError: invalid token ids or extras; a token above ``2**32 - 1`` with
                blake3 (LMCache packs tokens as ``>I``).
        """
        tokens = as_token_array(token_ids)
        extras = resolve_extras(extras, len(tokens))
        if extras.mm_items:
            tokens = apply_mm_placeholders(tokens, extras.mm_items, self.mm_placeholder)
        if self.algo == "blake3" and tokens.size and int(tokens.max()) > _U32_MAX:
            raise ValueError(f"token_ids must fit 32 bits with algo 'blake3' (<= {_U32_MAX}), "
                             f"got {int(tokens.max())}")
        n = tokens.shape[0]
        end = n if self.hashes_partial_tail else n - n % self.block_size
        hashes = []
        prefix = self.none_hash
        for start in range(0, end, self.block_size):
            prefix = self._hash_chunk(prefix, tokens[start:start + self.block_size])
            hashes.append(prefix)
        return hashes

    def to_u64(self, block_hash: int | bytes) -> int:
        """The 64-bit key of one native hash: two's complement of a ``chunked_token_db``
        int; the last 8 bytes, big-endian, of an ``mp_token_hasher`` digest (§4.2).

        Raises:
            ValueError: a hash of the other mode's type, or an int outside ``[-2**63, 2**64)``.
        """
        if self.mode == "mp_token_hasher":
            if not isinstance(block_hash, bytes):
                raise ValueError(f"block_hash must be digest bytes in mode 'mp_token_hasher', got {block_hash!r}")
            return u64_from_bytes_last8(block_hash)
        return u64_from_signed(check_int("block_hash", block_hash, low=-(1 << 63), high=U64_MASK))

