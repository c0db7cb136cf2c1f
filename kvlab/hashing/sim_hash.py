"""kvlab's own fast chained 64-bit block hash, for token-level synthetic workloads.

Not an engine's hash: use it when only *which* prefixes are equal matters (simulation),
not the engine's exact ids. Per block, the tokens at even and at odd positions are mixed
into two 64-bit lanes seeded differently from the parent hash (xor, multiply by an odd
constant, rotate: a non-linear bijection per token; two lanes run in parallel), the
lanes and the block length are combined (so a partial tail differs from a full block
with the same leading tokens), and the result is finalised with MurmurHash3's
``fmix64`` avalanche.

Collisions: treating keys as uniform over 2^64, the chance that any two of ``n``
distinct prefixes share a key is about ``n² / 2^65`` — 2.7e-8 for a million blocks,
2.7e-6 for ten million, 2.7 % for a billion. Use an engine profile (or check with
:meth:`kvlab.traces.Trace.check_chained`) when that matters.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvlab.core.jit import kernel_jit
from kvlab.core.validate import check_flag, check_u64
from kvlab.hashing.base import (
    BlockHasher,
    RequestExtras,
    as_token_array,
    check_block_size,
    resolve_extras,
)

_K_ROOT = np.uint64(0x9E3779B97F4A7C15)
_K_PARENT = np.uint64(0xC2B2AE3D27D4EB4F)
_MUL = np.uint64(0xFF51AFD7ED558CCD)
_MUL2 = np.uint64(0xC4CEB9FE1A85EC53)


@kernel_jit
def _fmix64(x: np.uint64) -> np.uint64:
    x ^= x >> np.uint64(33)
    x *= _MUL
    x ^= x >> np.uint64(33)
    x *= _MUL2
    x ^= x >> np.uint64(33)
    return x


@kernel_jit
def _chain(tokens: np.ndarray, block_size: int, seed: np.uint64, partial_tail: bool) -> np.ndarray:
    num_tokens = tokens.shape[0]
    num_blocks = num_tokens // block_size
    if partial_tail and num_tokens % block_size:
        num_blocks += 1
    out = np.empty(num_blocks, dtype=np.uint64)
    h = _fmix64(seed ^ _K_ROOT)
    for b in range(num_blocks):
        start = b * block_size
        end = min(start + block_size, num_tokens)
        # two independent lanes (even / odd positions) halve the serial dependency chain
        even = h ^ _K_PARENT
        odd = h ^ _K_ROOT
        i = start
        while i + 1 < end:
            even = (even ^ np.uint64(tokens[i])) * _MUL
            odd = (odd ^ np.uint64(tokens[i + 1])) * _MUL2
            even = (even << np.uint64(31)) | (even >> np.uint64(33))
            odd = (odd << np.uint64(29)) | (odd >> np.uint64(35))
            i += 2
        if i < end:
            even = (even ^ np.uint64(tokens[i])) * _MUL
            even = (even << np.uint64(31)) | (even >> np.uint64(33))
        acc = even ^ ((odd << np.uint64(17)) | (odd >> np.uint64(47))) ^ np.uint64(end - start)
        h = _fmix64(acc)
        out[b] = h
    return out


def chain_u64(token_ids: Sequence[int] | np.ndarray, block_size: int, seed: int = 0, *,
              partial_tail: bool = False) -> np.ndarray:
    """Chained 64-bit keys of a prompt's blocks (numba; kvlab's simulation hash).

    Args:
        token_ids: ``int[n]`` token ids (≥ 0, < 2^64).
        block_size: tokens per block.
        seed: root seed (``0 <= seed < 2^64``); different seeds give unrelated chains.
        partial_tail: also key a trailing partial block.

    Returns:
        ``uint64[n // block_size]`` (``+1`` with a keyed partial tail); key ``i`` covers
        tokens ``[0, (i + 1) * block_size)``.

    Raises:
        ValueError: bad token ids, block size or seed.

    Example:
        >>> keys = chain_u64(range(40), block_size=16)
        >>> len(keys), keys.dtype.name
        (2, 'uint64')
        >>> bool(chain_u64(range(32), 16)[0] == keys[0])  # same first block, same key
        True
    """
    tokens = as_token_array(token_ids)
    block_size = check_block_size(block_size)
    seed = check_u64("seed", seed)
    return _chain(tokens, block_size, np.uint64(seed), check_flag("partial_tail", partial_tail))


class SimHasher(BlockHasher):
    """:func:`chain_u64` as a :class:`BlockHasher` profile (``name="kvlab.chain_u64"``).

    Extras (LoRA, multimodal, salt) are not modelled: passing non-empty extras raises,
    rather than silently ignoring them.

    Args:
        block_size: tokens per block.
        seed: root seed.
        partial_tail: key a trailing partial block too.

    Raises:
        ValueError: bad block size or seed.

    Example:
        >>> hasher = SimHasher(block_size=4, seed=7)
        >>> hasher.block_keys([1, 2, 3, 4, 5]).tolist() == chain_u64([1, 2, 3, 4], 4, 7).tolist()
        True
    """

    name = "kvlab.chain_u64"

    def __init__(self, block_size: int, seed: int = 0, *, partial_tail: bool = False) -> None:
        self.block_size = check_block_size(block_size)
        self.seed = check_u64("seed", seed)
        self.hashes_partial_tail = check_flag("partial_tail", partial_tail)

    def block_hashes(self, token_ids: Sequence[int] | np.ndarray,
                     extras: RequestExtras | None = None) -> list[int]:
        """Keys as Python ints (the native form is already 64-bit)."""
        return self.block_keys(token_ids, extras).tolist()

    def block_keys(self, token_ids: Sequence[int] | np.ndarray, extras: RequestExtras | None = None) -> np.ndarray:
        """``uint64`` keys, straight from the kernel."""
        if not resolve_extras(extras, num_tokens=2**63).is_empty:
            raise ValueError("SimHasher does not model request extras (LoRA, multimodal, cache salt); "
                             "use an engine profile")
        return chain_u64(token_ids, self.block_size, self.seed, partial_tail=self.hashes_partial_tail)

    def to_u64(self, block_hash: int) -> int:
        """Identity: keys are already u64 (checked)."""
        return check_u64("block_hash", block_hash)

    def __repr__(self) -> str:
        return f"SimHasher(block_size={self.block_size}, seed={self.seed}, partial_tail={self.hashes_partial_tail})"
