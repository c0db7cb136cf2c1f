"""vLLM v1 (0.33.0) prefix-caching block hashes (docs/specs/hashing.md §1).

::

    NONE_HASH = hash_fn(seed)      seed = PYTHONHASHSEED verbatim, else "vllm-none-hash"
                                   (sha256, sha256_cbor) or os.urandom(32).hex() (xxhash*)
    h_i = hash_fn((h_{i-1} or NONE_HASH, tuple(tokens[i*B:(i+1)*B]), extra_keys_i))
    event id of h_i = last 8 bytes, big-endian (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1)

Full blocks only; ``extra_keys_i`` per :mod:`kvlab.hashing.vllm_extra_keys`. Blocks without
extra keys under the pickle algos (``sha256``, the default, and ``xxhash``) go through
:mod:`kvlab.hashing.vllm_pickle`, which builds vLLM's exact pickle bytes for all blocks at
once; every other block is serialised with ``pickle.dumps`` or ``cbor2.dumps`` itself.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence

import numpy as np

from kvlab.core.validate import check_count, check_rng, check_str
from kvlab.hashing.base import (
    BlockHasher,
    RequestExtras,
    as_token_array,
    check_block_size,
    resolve_extras,
    u64_from_bytes_last8,
)
from kvlab.hashing.digests import DEFAULT_NONE_HASH_SEED, check_algo, hash_fn, none_hash
from kvlab.hashing.vllm_cbor import chain_sha256_cbor, sha256_cbor_chain_array
from kvlab.hashing.vllm_extra_keys import BlockExtraKeys, ExtraKey, event_extra_keys_of
from kvlab.hashing.vllm_pickle import PICKLE_ALGOS, chain_without_extras, sha256_chain_array

_RANDOM_SEED_ALGOS = ("xxhash", "xxhash_cbor")
#: The algos whose chains of blocks without extra keys a kernel returns as one array.
_ARRAY_CHAINS = {"sha256": sha256_chain_array, "sha256_cbor": sha256_cbor_chain_array}
#: The kvlab package directory: frames inside it are skipped when a warning names its caller.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _caller_stacklevel() -> int:
    """``stacklevel`` that makes a warning raised by the function calling this one point
    at the first frame outside kvlab (the user's call, whether it went to
    :class:`VllmHasher` directly or through :func:`kvlab.hashing.vllm` / ``get_hasher``)."""
    level, frame = 2, sys._getframe(2)  # 0: here, 1: the warning function, 2: its caller
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        level, frame = level + 1, frame.f_back
    return level


def _uint64_tokens(token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Checked token ids as ``uint64[n]`` (non-negative, so the int64 view is exact)."""
    tokens = as_token_array(token_ids)
    return tokens.view(np.uint64) if tokens.dtype == np.int64 else tokens


class VllmHasher(BlockHasher):
    """vLLM v1 block hashes: ``get_request_block_hasher`` with ``hash_block_tokens`` over
    ``get_hash_fn_by_name(algo)`` (vLLM 0.33.0; docs/specs/hashing.md §1.2–1.8).

    Native hashes are the digest bytes (32 for ``sha256*``, 16 for ``xxhash*``); the block
    key (:meth:`to_u64`) is the id vLLM publishes in KV events. Only full blocks are
    hashed (``hashes_partial_tail = False``, §1.6).

    Keys depend only on the values of the request's strings, never on their identity:
    each user string is pickled as a separate object, as in vLLM (one-character strings
    are CPython singletons: see :func:`~kvlab.hashing.vllm_extra_keys.fresh_str`).
    Prompt embeddings given as an array are hashed by their dtype and raw bytes, as vLLM
    hashes its tensor's (often bf16/fp16; numpy has no bf16): pass an array of the same
    raw bytes (for bf16, its bits as ``int16``), or the per-block digests as a mapping,
    to reproduce vLLM's keys.

    Under NVIDIA Dynamo, vLLM receives the cache salt prefixed
    ``"dynamo-cache-salt:<namespace>"`` (docs/specs/hashing.md §3.4): pass that whole
    string as ``cache_salt`` to reproduce vLLM's keys in a Dynamo deployment.

    Not modelled: EAGLE / lookahead hashing (``num_hash_lookahead_tokens > 0``, §1.5),
    and hybrid models whose KV-cache groups hash at the gcd of their block sizes (§1.6):
    hash at that gcd and take a larger group's view with
    :func:`~kvlab.hashing.base.coarse_view`.

    Args:
        algo: ``--prefix-caching-hash-algo``: ``sha256`` (default), ``sha256_cbor``,
            ``xxhash``, ``xxhash_cbor``.
        block_size: tokens per block (vLLM's default 16).
        seed: ``PYTHONHASHSEED`` as vLLM reads it: a string used verbatim. ``None`` means
            PYTHONHASHSEED *unset*: ``"vllm-none-hash"`` for the sha256 algos (vLLM PR
            #51875) and, for the xxhash algos, vLLM's per-process ``os.urandom(32).hex()``,
            modelled by 32 bytes drawn from ``rng``. kvlab never reads this process's
            ``PYTHONHASHSEED`` (results do not depend on the environment): to match a vLLM
            run with ``PYTHONHASHSEED=0``, pass ``seed="0"``.
        rng: the ``numpy.random.Generator`` for that draw; only for the xxhash algos with
            ``seed=None``. Hashers given equally seeded generators share keys. ``None``
            draws from OS entropy, like vLLM, and warns: such a hasher shares keys with
            no other.

    Raises:
        ValueError: unknown algo, block size < 1, a seed that is not a string or None, an
            rng that is not a ``numpy.random.Generator``, or an rng given with a sha256
            algo or an explicit seed (it would be ignored).

    Warns:
        UserWarning: an xxhash algo with ``seed=None`` and ``rng=None`` (pointing at the
            caller's line, also through :func:`kvlab.hashing.vllm`).

    Example:
        >>> hasher = VllmHasher(block_size=4)
        >>> [h.hex()[:12] for h in hasher.block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9])]
        ['52a7f141c609', 'bee96bce54f5']
        >>> hasher.block_keys([1, 2, 3, 4]).tolist()  # the KV-event ids
        [1882140585328457242]
        >>> hasher.max_cache_hit_tokens(9)  # the last prompt token is always recomputed
        8
    """

    hashes_partial_tail = False

    def __init__(self, *, algo: str = "sha256", block_size: int = 16, seed: str | None = None,
                 rng: np.random.Generator | None = None) -> None:
        self.algo = check_algo(algo)
        self.block_size = check_block_size(block_size)
        check_str("seed", seed, optional=True)  # PYTHONHASHSEED semantics
        check_rng("rng", rng, optional=True)
        if rng is not None and (seed is not None or algo not in _RANDOM_SEED_ALGOS):
            raise ValueError(f"rng is only used for the xxhash algos with seed=None, got rng={rng!r} with "
                             f"algo={algo!r}, seed={seed!r}")
        self.name = f"vllm.{algo}"
        self.seed = seed
        if seed is not None:
            self.none_hash_seed = seed
        elif algo in _RANDOM_SEED_ALGOS:
            if rng is None:
                warnings.warn(
                    f"vllm.{algo} with seed=None and rng=None: like vLLM, a random NONE_HASH seed is "
                    "drawn (OS entropy), so this hasher never shares cache keys with another; pass "
                    "seed= (PYTHONHASHSEED) or a seeded rng= to reproduce", UserWarning,
                    stacklevel=_caller_stacklevel())
                rng = np.random.default_rng()
            self.none_hash_seed = rng.bytes(32).hex()
        else:
            self.none_hash_seed = DEFAULT_NONE_HASH_SEED
        self._none_hash = none_hash(algo, self.none_hash_seed)
        self._hash_fn = hash_fn(algo)

    @property
    def none_hash(self) -> bytes:
        """NONE_HASH, the parent of every chain's first block: ``hash_fn(seed string)``
        (``kv_cache_utils.init_none_hash``, §1.3)."""
        return self._none_hash

    def block_hashes(self, token_ids: Sequence[int] | np.ndarray,
                     extras: RequestExtras | None = None) -> list[bytes]:
        """Chained hashes of the prompt's full blocks (``request_block_hasher``, §1.4–1.6).

        Args:
            token_ids: ``int[n]`` token ids (``0 <= t < 2**64``).
            extras: LoRA, MM items, cache salt, prompt embeddings (§1.5), or ``None``.

        Returns:
            ``n // block_size`` digests.

        Raises:
            ValueError: invalid token ids or extras, or an MM item ending after the prompt.
        """
        tokens = _uint64_tokens(token_ids)
        resolve_extras(extras, tokens.shape[0])
        num_blocks = tokens.shape[0] // self.block_size
        blocks = tokens[:num_blocks * self.block_size].reshape(num_blocks, self.block_size)
        return self._chain(None, blocks, BlockExtraKeys(extras, self.block_size))

    def block_hash_array(self, token_ids: Sequence[int] | np.ndarray,
                         extras: RequestExtras | None = None) -> np.ndarray:
        """:meth:`block_hashes` as one array, row ``i`` the bytes of hash ``i``.

        Without extras under ``sha256`` and ``sha256_cbor`` the kernel's array is returned
        as it is, with no Python object per block (the fastest form for many blocks);
        ``bytes(row)`` (or ``row.tobytes()``) is vLLM's ``BlockHash`` value.

        Args:
            token_ids: ``int[n]`` token ids (``0 <= t < 2**64``).
            extras: LoRA, MM items, cache salt, prompt embeddings (§1.5), or ``None``.

        Returns:
            ``uint8[n // block_size, digest_bytes]`` (32 for ``sha256*``, 16 for ``xxhash*``).

        Raises:
            ValueError: invalid token ids or extras, or an MM item ending after the prompt.

        Example:
            >>> hasher = VllmHasher(block_size=4)
            >>> rows = hasher.block_hash_array(range(9))
            >>> rows.shape, [bytes(row) for row in rows] == hasher.block_hashes(range(9))
            ((2, 32), True)
        """
        tokens = _uint64_tokens(token_ids)
        resolve_extras(extras, tokens.shape[0])
        num_blocks = tokens.shape[0] // self.block_size
        blocks = tokens[:num_blocks * self.block_size].reshape(num_blocks, self.block_size)
        keys = BlockExtraKeys(extras, self.block_size)
        if keys.always_none and self.algo in _ARRAY_CHAINS:
            digests = _ARRAY_CHAINS[self.algo](self._none_hash, blocks)
            if digests is not None:  # None without a SHA-256 engine: the list path below
                return digests
        hashes = self._chain(None, blocks, keys)
        return np.frombuffer(bytearray(b"".join(hashes)), np.uint8).reshape(len(hashes), len(self._none_hash))

    def block_keys(self, token_ids: Sequence[int] | np.ndarray, extras: RequestExtras | None = None) -> np.ndarray:
        """``uint64[num_blocks]``: the KV-event id (:meth:`to_u64`) of every block hash,
        read from :meth:`block_hash_array` without a Python object per block.

        Raises:
            ValueError: as :meth:`block_hash_array`.
        """
        digests = self.block_hash_array(token_ids, extras)
        return np.ascontiguousarray(digests[:, -8:]).view(">u8").ravel().astype(np.uint64)

    def to_u64(self, block_hash: bytes) -> int:
        """vLLM's KV-event id of a hash: its last 8 bytes, big-endian
        (``maybe_convert_block_hash``, §1.7).

        Raises:
            ValueError: not a digest of this profile's length.
        """
        if not isinstance(block_hash, bytes) or len(block_hash) != len(self._none_hash):
            raise ValueError(f"block_hash must be a {len(self._none_hash)}-byte {self.name} digest, "
                             f"got {block_hash!r}")
        return u64_from_bytes_last8(block_hash)

    def extra_keys(self, num_tokens: int, extras: RequestExtras | None = None) -> list[tuple[ExtraKey, ...] | None]:
        """Tagged extra keys of each full block of an ``num_tokens`` prompt, as hashed
        (``generate_block_hash_extra_keys``, §1.5); ``None`` for a block without keys.

        Raises:
            ValueError: negative ``num_tokens`` or invalid extras.
        """
        num_blocks = check_count("num_tokens", num_tokens) // self.block_size
        return BlockExtraKeys(extras, self.block_size).next_blocks(num_blocks)

    def event_extra_keys(self, num_tokens: int, extras: RequestExtras | None = None) -> list[tuple | None] | None:
        """``BlockStored.extra_keys`` for the full blocks of an ``num_tokens`` prompt: one
        untagged entry per block (``to_event_extra_keys``, §1.7), ``None`` when there is no
        block.

        Raises:
            ValueError: negative ``num_tokens`` or invalid extras.
        """
        keys = self.extra_keys(num_tokens, extras)
        return [event_extra_keys_of(k) for k in keys] if keys else None

    def max_cache_hit_tokens(self, num_tokens: int) -> int:
        """Most prompt tokens a prefix-cache hit can cover: ``floor((n - 1) / B) * B``
        (the last token is recomputed for its logits; ``KVCacheManager.get_computed_blocks``,
        §1.6), 0 for ``n <= 1``.

        Raises:
            ValueError: negative or non-integer ``num_tokens``.
        """
        num_tokens = check_count("num_tokens", num_tokens)
        return max(num_tokens - 1, 0) // self.block_size * self.block_size

    def incremental(self, extras: RequestExtras | None = None) -> VllmIncrementalHasher:
        """A hasher for one request whose tokens arrive over time (see
        :class:`VllmIncrementalHasher`).

        Raises:
            ValueError: invalid extras.
        """
        return VllmIncrementalHasher(self, extras)

    def _chain(self, parent: bytes | None, blocks: np.ndarray, keys: BlockExtraKeys) -> list[bytes]:
        """Hashes of ``blocks`` (``uint64[n, B]``) chained after ``parent`` (``None``: the
        request's first block), taking their extra keys from ``keys``; under the pickle
        algos, runs of blocks without keys take the fast path of :mod:`~kvlab.hashing.vllm_pickle`."""
        extra = keys.next_blocks(blocks.shape[0])
        h = parent or self._none_hash
        if self.algo == "sha256_cbor" and keys.always_none:
            hashes = chain_sha256_cbor(h, blocks)  # None without libcrypto: cbor2 below
            if hashes is not None:
                return hashes
        fast = self.algo in PICKLE_ALGOS
        if fast and keys.always_none:
            return chain_without_extras(self.algo, h, blocks)
        hashes: list[bytes] = []
        i = 0
        while i < len(extra):
            if fast and extra[i] is None:
                j = next((k for k in range(i + 1, len(extra)) if extra[k] is not None), len(extra))
                hashes += chain_without_extras(self.algo, h, blocks[i:j])
            else:
                j = i + 1
                hashes.append(self._hash_fn((h, tuple(blocks[i].tolist()), extra[i])))
            h = hashes[-1]
            i = j
        return hashes


class VllmIncrementalHasher:
    """One request's block hashes as its tokens arrive, prompt then generated tokens.

    Models vLLM 0.33 ``get_request_block_hasher`` as ``Request.append_output_token_ids``
    calls it (docs/specs/hashing.md §1.6): after each :meth:`append`, every block that
    became full is hashed, chained to the previous block. MM items, LoRA, salt and prompt
    embeddings are known up front; items are taken with the ranges given, even past the
    prompt. The result always equals :meth:`VllmHasher.block_hashes` of all tokens so far.

    Agrees with vLLM 0.33 append by append: a later call of its ``request_block_hasher``
    resumes the MM scan at the first item overlapping the new block
    (``get_mm_features_in_window``), so a block completed by generated tokens keeps an
    earlier image that still overlaps it (bug-report case 2: a block ``[t0, A, A, t1, B,
    t2]`` completed by two generated tokens is keyed on both A and B). Releases that
    restarted the scan at the last item (``curr_mm_idx = -1``) keyed such a block on B
    only; kvlab does not model them (tests/vectors/vllm_incremental_hashes.json pins the
    0.33 behaviour).

    Args:
        hasher: the profile.
        extras: the request's extras, or ``None``.

    Raises:
        ValueError: invalid extras.

    Example:
        >>> request = VllmHasher(block_size=4).incremental()
        >>> request.append([1, 2, 3]), len(request.append([4, 5]))
        ([], 1)
        >>> request.block_hashes == VllmHasher(block_size=4).block_hashes([1, 2, 3, 4, 5])
        True
    """

    def __init__(self, hasher: VllmHasher, extras: RequestExtras | None = None) -> None:
        if not isinstance(hasher, VllmHasher):
            raise ValueError(f"hasher must be a VllmHasher, got {type(hasher).__name__}")
        self.hasher = hasher
        self._keys = BlockExtraKeys(extras, hasher.block_size)
        self._pending = np.zeros(0, np.uint64)  # tokens after the last full block
        self._hashes: list[bytes] = []
        self.num_tokens = 0

    @property
    def block_hashes(self) -> list[bytes]:
        """Hashes of the full blocks so far (a copy)."""
        return list(self._hashes)

    def append(self, token_ids: Sequence[int] | np.ndarray) -> list[bytes]:
        """Add tokens; return the hashes of the blocks they completed (maybe none).

        Raises:
            ValueError: invalid token ids, or prompt embeddings lacking a completed block.
        """
        added = _uint64_tokens(token_ids)
        tokens = np.concatenate([self._pending, added])
        size = self.hasher.block_size
        num_blocks = tokens.shape[0] // size
        parent = self._hashes[-1] if self._hashes else None
        new = self.hasher._chain(parent, tokens[:num_blocks * size].reshape(num_blocks, size), self._keys)
        self._hashes += new
        self._pending = tokens[num_blocks * size:]
        self.num_tokens += added.shape[0]
        return new
