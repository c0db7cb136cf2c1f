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

import warnings
from collections.abc import Sequence

import numpy as np

from kvlab.hashing.base import BlockHasher, RequestExtras, as_token_array, check_block_size, u64_from_bytes_last8
from kvlab.hashing.digests import DEFAULT_NONE_HASH_SEED, check_algo, hash_fn, none_hash
from kvlab.hashing.vllm_extra_keys import BlockExtraKeys, ExtraKey, event_extra_keys_of
from kvlab.hashing.vllm_pickle import PICKLE_ALGOS, chain_without_extras

_RANDOM_SEED_ALGOS = ("xxhash", "xxhash_cbor")


def _uint64_tokens(token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Checked token ids as ``uint64[n]`` (non-negative, so the int64 view is exact)."""
    tokens = as_token_array(token_ids)
    return tokens.view(np.uint64) if tokens.dtype == np.int64 else tokens


def _check_n_tokens(n_tokens: object) -> int:
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, (int, np.integer)) or n_tokens < 0:
        raise ValueError(f"n_tokens must be an integer >= 0, got {n_tokens!r}")
    return int(n_tokens)


class VllmHasher(BlockHasher):
    """vLLM v1 block hashes: ``get_request_block_hasher`` with ``hash_block_tokens`` over
    ``get_hash_fn_by_name(algo)`` (vLLM 0.33.0; docs/specs/hashing.md §1.2–1.8).

    Native hashes are the digest bytes (32 for ``sha256*``, 16 for ``xxhash*``); the block
    key (:meth:`to_u64`) is the id vLLM publishes in KV events. Only full blocks are
    hashed (``hashes_partial_tail = False``, §1.6).

    Args:
        algo: ``--prefix-caching-hash-algo``: ``sha256`` (default), ``sha256_cbor``,
            ``xxhash``, ``xxhash_cbor``.
        block_size: tokens per block (vLLM's default 16).
        seed: ``PYTHONHASHSEED`` as vLLM reads it: a string used verbatim; ``None`` = unset,
            which means ``"vllm-none-hash"`` for the sha256 algos (vLLM PR #51875) and, for
            the xxhash algos, vLLM's per-process ``os.urandom(32).hex()`` — modelled by 32
            bytes drawn from ``rng``, with a warning (two such hashers never share keys).
        rng: the ``numpy.random.Generator`` for that draw (default: OS entropy, like
            vLLM); used only for the xxhash algos with ``seed=None``.

    Raises:
        ValueError: unknown algo, block size < 1, a seed that is not a string or None, an
            rng that is not a ``numpy.random.Generator``.

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
        if seed is not None and not isinstance(seed, str):
            raise ValueError(f"seed must be a string (PYTHONHASHSEED semantics) or None, got {seed!r}")
        if rng is not None and not isinstance(rng, np.random.Generator):
            raise ValueError(f"rng must be a numpy.random.Generator or None, got {type(rng).__name__}")
        self.name = f"vllm.{algo}"
        self.seed = seed
        if seed is not None:
            self.none_hash_seed = seed
        elif algo in _RANDOM_SEED_ALGOS:
            warnings.warn(
                f"vllm.{algo} with seed=None: vLLM draws a random NONE_HASH seed per process "
                "(os.urandom), so two such instances never share cache keys; pass seed= "
                "(PYTHONHASHSEED) or a seeded rng= to reproduce", UserWarning, stacklevel=2)
            self.none_hash_seed = (rng if rng is not None else np.random.default_rng()).bytes(32).hex()
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
            ValueError: invalid token ids or extras.
        """
        tokens = _uint64_tokens(token_ids)
        n_blocks = tokens.shape[0] // self.block_size
        blocks = tokens[:n_blocks * self.block_size].reshape(n_blocks, self.block_size)
        return self._chain(None, blocks, BlockExtraKeys(extras, self.block_size))

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

    def extra_keys(self, n_tokens: int, extras: RequestExtras | None = None) -> list[tuple[ExtraKey, ...] | None]:
        """Tagged extra keys of each full block of an ``n_tokens`` prompt, as hashed
        (``generate_block_hash_extra_keys``, §1.5); ``None`` for a block without keys.

        Raises:
            ValueError: negative ``n_tokens`` or invalid extras.
        """
        return BlockExtraKeys(extras, self.block_size).next_blocks(_check_n_tokens(n_tokens) // self.block_size)

    def event_extra_keys(self, n_tokens: int, extras: RequestExtras | None = None) -> list[tuple | None] | None:
        """``BlockStored.extra_keys`` for the full blocks of an ``n_tokens`` prompt: one
        untagged entry per block (``to_event_extra_keys``, §1.7), ``None`` when there is no
        block.

        Raises:
            ValueError: negative ``n_tokens`` or invalid extras.
        """
        keys = self.extra_keys(n_tokens, extras)
        return [event_extra_keys_of(k) for k in keys] if keys else None

    def max_cache_hit_tokens(self, n_tokens: int) -> int:
        """Most prompt tokens a prefix-cache hit can cover: ``floor((n - 1) / B) * B``
        (the last token is recomputed for its logits; ``KVCacheManager.get_computed_blocks``,
        §1.6), 0 for ``n <= 1``.

        Raises:
            ValueError: negative or non-integer ``n_tokens``.
        """
        n_tokens = _check_n_tokens(n_tokens)
        return max(n_tokens - 1, 0) // self.block_size * self.block_size

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
        fast = self.algo in PICKLE_ALGOS
        h = parent or self._none_hash
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
        n_blocks = tokens.shape[0] // size
        parent = self._hashes[-1] if self._hashes else None
        new = self.hasher._chain(parent, tokens[:n_blocks * size].reshape(n_blocks, size), self._keys)
        self._hashes += new
        self._pending = tokens[n_blocks * size:]
        self.num_tokens += added.shape[0]
        return new
