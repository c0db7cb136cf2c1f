"""LMCache 0.5.6 chunk hashing: the in-process ``ChunkedTokenDatabase`` and the
multiprocess server's ``TokenHasher`` (docs/specs/hashing.md §4).

LMCache keys KV by *chunks* of ``chunk_size`` tokens (default 256), chained like vLLM's
blocks but with its own tuple shape, so its keys never equal vLLM's::

    chunked_token_db (lmcache/v1/token_database.py, §4.1)
        prefix_i = normalize( H((prefix_{i-1}, tuple(chunk_i), ())) )
        normalize(bytes) = int.from_bytes(digest[:8], "big")   (FIRST 8 bytes); an int is kept

    mp_token_hasher (lmcache/v1/multiprocess/token_hasher.py, §4.2), full chunks only
        blake3:  h_i = blake3( h_{i-1} ‖ pack(">%dI", *chunk_i) ),  h_{-1} = blake3(12 zero bytes)
        else:    h_i = H((h_{i-1}, tuple(chunk_i), None)), published as bytes
                 (an int h_i as 8 signed big-endian bytes)

Which ``H`` and which root LMCache uses depends on the process it runs in (the *setup*):

    =====================  ====================  =========================================
    setup                  H                     root (chunked / mp)
    =====================  ====================  =========================================
    vLLM importable,       vLLM's                first 8 B of vLLM's NONE_HASH /
    a vLLM algo            get_hash_fn_by_name   vLLM's NONE_HASH
    vLLM importable,       Python ``hash()``     ``hash(seed string)`` (vLLM's
    ``"builtin"``                                init_none_hash): needs PYTHONHASHSEED
    vLLM not importable,   Python ``hash()``     0 / ``hash((0, (0,), None))``
    any algo but blake3
    =====================  ====================  =========================================

Python's ``hash()`` is modelled by :func:`~kvlab.hashing.cpython_hash.python_hash`, never called.
Multimodal: LMCache derives keys from token ids only; its vLLM connector first overwrites
every MM item's placeholder span (:func:`~kvlab.hashing.lmcache_mm.apply_mm_placeholders`).
"""

from __future__ import annotations

from collections.abc import Sequence

import blake3
import numpy as np

from kvlab.core.validate import check_choice, check_flag, check_int, check_str
from kvlab.hashing.base import (
    U64_MASK,
    BlockHasher,
    RequestExtras,
    as_token_array,
    check_block_size,
    resolve_extras,
    u64_from_bytes_last8,
    u64_from_signed,
)
from kvlab.hashing.cpython_hash import (
    MAX_PYTHONHASHSEED,
    NONE_HASH_CPYTHON_312,
    hash_secret_from_pythonhashseed,
    python_hash,
)
from kvlab.hashing.digests import DEFAULT_NONE_HASH_SEED, HASH_ALGOS, hash_fn, none_hash
from kvlab.hashing.lmcache_mm import MM_PLACEHOLDER_MODES, apply_mm_placeholders

MODES = ("chunked_token_db", "mp_token_hasher")
#: ``pre_caching_hash_algorithm`` values of the in-process connector.
CHUNKED_ALGOS = ("builtin", *HASH_ALGOS)
#: ``--hash-algorithm`` values of the multiprocess server.
MP_ALGOS = ("blake3", "builtin", *HASH_ALGOS)
_DEFAULT_ALGO = {"chunked_token_db": "sha256_cbor", "mp_token_hasher": "blake3"}
#: The multiprocess server's blake3 root: ``blake3(0 as 8 signed BE bytes ‖ pack(">I", 0))``.
MP_BLAKE3_NONE_HASH = blake3.blake3(bytes(12)).digest()
_U32_MAX = (1 << 32) - 1


def normalize_hash_to_int(value: bytes | int) -> int:
    """LMCache's ``_normalize_hash_to_int``: a digest's FIRST 8 bytes, big-endian,
    unsigned; an int (Python ``hash()``) is kept.

    Note vLLM's event form takes the *last* 8 bytes (docs/specs/hashing.md §1.7, §4.1).

    Example:
        >>> normalize_hash_to_int(bytes(range(16))), normalize_hash_to_int(-5)
        (283686952306183, -5)
    """
    return int.from_bytes(value[:8], "big") if isinstance(value, bytes) else value


def _check_pythonhashseed(seed: str | None, algo: str) -> int:
    """``PYTHONHASHSEED`` as CPython reads it, required where ``hash(str)`` is the root."""
    if seed is None:
        raise ValueError(f"algo {algo!r} with vllm_importable=True needs none_hash_seed (PYTHONHASHSEED): its root "
                         "is Python's hash() of the seed string, which CPython salts per process unless "
                         "PYTHONHASHSEED is set")
    if not (seed.isascii() and seed.isdigit() and int(seed) <= MAX_PYTHONHASHSEED):
        raise ValueError(f"none_hash_seed={seed!r} with algo {algo!r} is PYTHONHASHSEED, which CPython accepts only as "
                         f"an integer in [0, {MAX_PYTHONHASHSEED}] (or 'random', not reproducible)")
    return int(seed)


class LMCacheHasher(BlockHasher):
    """LMCache 0.5.6 chunk keys (docs/specs/hashing.md §4) as a :class:`BlockHasher` profile.

    Two modes, named ``"lmcache.<mode>.<algo>"`` like the golden vectors, with
    ``".no_vllm"`` appended when vLLM is not importable and the algo is not blake3:

    * ``"chunked_token_db"`` — the in-process connector's ``ChunkedTokenDatabase``
      (``_hash_tokens``, ``_prefix_hash``, ``process_tokens``): native hashes are ``int``
      (first 8 digest bytes, or a Python ``hash()`` value, possibly negative);
      :meth:`to_u64` is their two's complement. ``save_unfull_chunk`` hashes the partial
      last chunk too.
    * ``"mp_token_hasher"`` — the multiprocess server's ``TokenHasher.compute_chunk_hashes``:
      native hashes are ``bytes`` (the 32 / 16-byte digest; a Python ``hash()`` value as
      8 signed big-endian bytes); :meth:`to_u64` is their last 8 bytes big-endian, what
      LMCache publishes in vLLM KV events (``lmcache_mp_connector._convert_kv_event_hash``).
      Full chunks only.

    :attr:`setup` says which computation the parameters select (the module table):
    LMCache falls back to Python's ``hash()`` for ``"builtin"`` and, when vLLM is not
    importable, for *every* algorithm but blake3, so ``algo="sha256_cbor",
    vllm_importable=False`` gives the same keys as ``algo="builtin"`` there. Python's
    hash of int tuples is deterministic (:func:`~kvlab.hashing.cpython_hash.python_hash`);
    a root ``hash(seed string)`` is reproducible only under a set ``PYTHONHASHSEED``, and
    the mp server's tuples hold ``None``, whose hash is a constant from CPython 3.12 on
    (an address before: pass it as ``python_none_hash``).

    LMCache chunk keys depend on token ids only: ``lora_name``, ``lora_path``,
    ``lora_identity``, ``cache_salt`` and ``prompt_embeds`` of :class:`RequestExtras` do
    not enter them (the model name sits in ``CacheEngineKey`` instead); ``mm_items``
    rewrite the placeholder tokens first, cut at the end of the tokens hashed.

    Args:
        chunk_size: tokens per chunk (LMCache default 256).
        mode: ``"chunked_token_db"`` or ``"mp_token_hasher"``.
        algo: ``chunked_token_db``: one of :data:`CHUNKED_ALGOS` (default
            ``"sha256_cbor"``; LMCache's own default ``pre_caching_hash_algorithm`` is
            ``"builtin"``, reproducible only with ``PYTHONHASHSEED`` set);
            ``mp_token_hasher``: one of :data:`MP_ALGOS` (default ``"blake3"``, LMCache's).
        save_unfull_chunk: hash a trailing partial chunk (``chunked_token_db`` only;
            LMCache's config default is False).
        vllm_importable: whether vLLM is importable in the LMCache process (see the table).
        none_hash_seed: ``$PYTHONHASHSEED`` verbatim in the modelled process, ``None``
            for unset; used where vLLM's NONE_HASH is the root: the sha256 algos then seed
            with ``"vllm-none-hash"``; the xxhash algos and ``"builtin"`` need it set
            (``"builtin"``: an integer string, as CPython requires).
        python_none_hash: ``hash(None)`` in the modelled mp server process (Python
            ``hash()`` setups of ``mp_token_hasher`` only); ``None`` means CPython 3.12+'s
            constant ``0xFCA86420``.
        mm_placeholder: ``"per_position"`` (LMCache 0.5.6; default) or
            ``"int16_legacy"`` (older releases; reproduces the collision of issue #3301).

    Attributes:
        none_hash: the chain root, in the mode's native form (``NONE_HASH`` / ``none_hash``).
        hash_function: ``"vllm.<algo>"``, ``"python_hash"`` or ``"blake3"``.
        setup: one line naming the hash function and root in use, and why.

    Raises:
        ValueError: any parameter outside the above, or one the setup does not use,
            naming it and the value.

    Example:
        >>> lm = LMCacheHasher(chunk_size=4)
        >>> lm.name, lm.block_hashes(list(range(1, 14)))[0]
        ('lmcache.chunked_token_db.sha256_cbor', 5919234735220982235)
        >>> LMCacheHasher(chunk_size=4, vllm_importable=False).block_hashes(list(range(1, 14)))[0]
        4965923915475442220
        >>> mp = LMCacheHasher(chunk_size=4, mode="mp_token_hasher")
        >>> mp.block_hashes(list(range(1, 14)))[0].hex()[:16], len(mp.block_keys(range(1, 14)))
        ('6309ed506b872190', 3)
    """

    def __init__(self, *, chunk_size: int = 256, mode: str = "chunked_token_db", algo: str | None = None,
                 save_unfull_chunk: bool = False, vllm_importable: bool = True,
                 none_hash_seed: str | None = None, python_none_hash: int | None = None,
                 mm_placeholder: str = "per_position") -> None:
        self.block_size = check_block_size(chunk_size, "chunk_size")
        check_choice("mode", mode, MODES)
        algos = CHUNKED_ALGOS if mode == "chunked_token_db" else MP_ALGOS
        algo = check_choice(f"algo for mode {mode!r}", _DEFAULT_ALGO[mode] if algo is None else algo, algos)
        save_unfull_chunk = check_flag("save_unfull_chunk", save_unfull_chunk)
        vllm_importable = check_flag("vllm_importable", vllm_importable)
        check_choice("mm_placeholder", mm_placeholder, MM_PLACEHOLDER_MODES)
        check_str("none_hash_seed", none_hash_seed, optional=True)
        check_int("python_none_hash", python_none_hash, low=-(1 << 63), high=(1 << 63) - 1, optional=True)
        if mode == "mp_token_hasher" and save_unfull_chunk:
            raise ValueError("save_unfull_chunk=True is not available with mode 'mp_token_hasher' "
                             "(TokenHasher.compute_chunk_hashes hashes full chunks only)")
        self.mode, self.algo, self.mm_placeholder = mode, algo, mm_placeholder
        self.vllm_importable, self.none_hash_seed = vllm_importable, none_hash_seed
        self.hashes_partial_tail = save_unfull_chunk
        no_vllm = not vllm_importable and algo != "blake3"
        self.name = f"lmcache.{mode}.{algo}" + (".no_vllm" if no_vllm else "")
        self.hash_function = ("blake3" if algo == "blake3" else "python_hash" if algo == "builtin" or no_vllm
                              else f"vllm.{algo}")
        uses_seed = vllm_importable and algo != "blake3"
        if none_hash_seed is not None and not uses_seed:
            raise ValueError(f"none_hash_seed={none_hash_seed!r} is unused with mode {mode!r}, algo {algo!r}, "
                             f"vllm_importable={vllm_importable} (the root does not depend on it)")
        if python_none_hash is not None and (mode != "mp_token_hasher" or self.hash_function != "python_hash"):
            raise ValueError(f"python_none_hash={python_none_hash!r} is unused: only the mp server's Python hash() "
                             f"setups hash None, not mode {mode!r} with hash function {self.hash_function!r}")
        if uses_seed and none_hash_seed is None and algo.startswith("xxhash"):
            raise ValueError(f"algo {algo!r} needs an explicit none_hash_seed: with PYTHONHASHSEED unset vLLM "
                             "seeds NONE_HASH from os.urandom, so the keys are not reproducible")
        self._python_none_hash = NONE_HASH_CPYTHON_312 if python_none_hash is None else python_none_hash
        self.none_hash: int | bytes = self._root(algo, none_hash_seed)
        self.setup = self._describe()

    def _root(self, algo: str, seed: str | None) -> int | bytes:
        if self.hash_function == "blake3":
            return MP_BLAKE3_NONE_HASH
        if self.hash_function == "python_hash":
            if self.vllm_importable:  # "builtin": vLLM's init_none_hash(hash) = hash(seed string)
                secret = hash_secret_from_pythonhashseed(_check_pythonhashseed(seed, algo))
                return python_hash(seed, hash_secret=secret)
            if self.mode == "chunked_token_db":
                return 0
            return python_hash((0, (0,), None), none_hash=self._python_none_hash)
        vllm_root = none_hash(algo, DEFAULT_NONE_HASH_SEED if seed is None else seed)
        return vllm_root if self.mode == "mp_token_hasher" else normalize_hash_to_int(vllm_root)

    def _describe(self) -> str:
        if self.hash_function == "blake3":
            return "blake3 over prefix ‖ tokens as >I; root blake3(12 zero bytes); vLLM plays no part"
        if self.hash_function.startswith("vllm."):
            first8 = "first 8 bytes of " if self.mode == "chunked_token_db" else ""
            return f"vLLM importable: vLLM's {self.algo}; root {first8}vLLM's NONE_HASH"
        if self.vllm_importable:
            return ("Python hash() ('builtin' is no vLLM algorithm); root hash(PYTHONHASHSEED string) through "
                    "vLLM's init_none_hash")
        root = "0" if self.mode == "chunked_token_db" else "hash((0, (0,), None))"
        return f"vLLM not importable: Python hash() whatever the algo ({self.algo!r} configured); root {root}"

    def _hash_chunk(self, prefix: int | bytes, chunk: np.ndarray) -> int | bytes:
        tokens = tuple(chunk.tolist())
        if self.hash_function == "blake3":
            return blake3.blake3(prefix + chunk.astype(">u4").tobytes()).digest()  # type: ignore[operator]
        last = () if self.mode == "chunked_token_db" else None
        if self.hash_function == "python_hash":
            return python_hash((prefix, tokens, last), none_hash=self._python_none_hash)
        digest = hash_fn(self.algo)((prefix, tokens, last))
        return normalize_hash_to_int(digest) if self.mode == "chunked_token_db" else digest

    def block_hashes(self, token_ids: Sequence[int] | np.ndarray,
                     extras: RequestExtras | None = None) -> list[int] | list[bytes]:
        """Chained chunk hashes in LMCache's native form: ``int`` (``chunked_token_db``)
        or ``bytes`` (``mp_token_hasher``), one per full chunk (plus the partial last
        chunk when ``save_unfull_chunk``).

        Args:
            token_ids: ``int[n]`` token ids: the prompt, or the prefix LMCache hashes.
            extras: only ``mm_items`` are used (placeholder spans rewritten first, cut at
                the end of ``token_ids``; an item starting after it is skipped).

        Raises:
            ValueError: invalid token ids or extras; a token above ``2**32 - 1`` with
                blake3 (LMCache packs tokens as ``>I``).
        """
        tokens = as_token_array(token_ids)
        extras = resolve_extras(extras, len(tokens), items_past_end=True)
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
        if self.mode == "mp_token_hasher" and self.hash_function == "python_hash":  # TokenHasher.hash_to_bytes
            return [h.to_bytes(8, "big", signed=True) for h in hashes]  # type: ignore[union-attr]
        return hashes

    def to_u64(self, block_hash: int | bytes) -> int:
        """The 64-bit key of one native hash: two's complement of a ``chunked_token_db``
        int; the last 8 bytes, big-endian, of ``mp_token_hasher`` bytes (§4.2).

        Raises:
            ValueError: a hash of the other mode's type, or an int outside ``[-2**63, 2**64)``.
        """
        if self.mode == "mp_token_hasher":
            if not isinstance(block_hash, bytes):
                raise ValueError(f"block_hash must be digest bytes in mode 'mp_token_hasher', got {block_hash!r}")
            return u64_from_bytes_last8(block_hash)
        return u64_from_signed(check_int("block_hash", block_hash, low=-(1 << 63), high=U64_MASK))
