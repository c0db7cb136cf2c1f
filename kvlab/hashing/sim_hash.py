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
def _chain_into(tokens, start, stop, block_size, root, partial_tail, out, pos):  # noqa: ANN001, ANN202
    """Keys of the prompt ``tokens[start:stop]`` into ``out[pos:]`` (chained from ``root``,
    the mixed seed); returns the position after the last key."""
    h = root
    for block_start in range(start, stop if partial_tail else stop - block_size + 1, block_size):
        end = min(block_start + block_size, stop)
        # two independent lanes (even / odd positions) halve the serial dependency chain
        even = h ^ _K_PARENT
        odd = h ^ _K_ROOT
        i = block_start
        while i + 1 < end:
            even = (even ^ np.uint64(tokens[i])) * _MUL
            odd = (odd ^ np.uint64(tokens[i + 1])) * _MUL2
            even = (even << np.uint64(31)) | (even >> np.uint64(33))
            odd = (odd << np.uint64(29)) | (odd >> np.uint64(35))
            i += 2
        if i < end:
            even = (even ^ np.uint64(tokens[i])) * _MUL
            even = (even << np.uint64(31)) | (even >> np.uint64(33))
        acc = even ^ ((odd << np.uint64(17)) | (odd >> np.uint64(47))) ^ np.uint64(end - block_start)
        h = _fmix64(acc)
        out[pos] = h
        pos += 1
    return pos


@kernel_jit
def _num_keys(num_tokens, block_size, partial_tail):  # noqa: ANN001, ANN202
    return (num_tokens + block_size - 1) // block_size if partial_tail else num_tokens // block_size


@kernel_jit
def _chain(tokens: np.ndarray, block_size: int, seed: np.uint64, partial_tail: bool) -> np.ndarray:
    out = np.empty(_num_keys(tokens.shape[0], block_size, partial_tail), dtype=np.uint64)
    _chain_into(tokens, 0, tokens.shape[0], block_size, _fmix64(seed ^ _K_ROOT), partial_tail, out, 0)
    return out


@kernel_jit
def _rot(x, r):  # noqa: ANN001, ANN202
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


#: Prompts hashed side by side by :func:`_chain_batch`: their chains are independent, so
#: the CPU overlaps their multiplications (one chain alone waits on each one's latency).
_STREAMS = 4


@kernel_jit
def _next_prompt(k, state, offsets, tokens, block_size, root, partial_tail, keys, key_offsets):  # noqa: ANN001, ANN202
    """Finish stream ``k``'s prompt (its partial tail) and give it the next prompt with a
    full block (prompts without one are keyed on the way); ``False`` when none is left.
    ``state[k]`` = (next prompt, token position, prompt end, key position, chain value)."""
    if state[k, 1] < state[k, 2]:  # the rest, shorter than a block
        _chain_into(tokens, state[k, 1], state[k, 2], block_size, np.uint64(state[k, 4]), partial_tail, keys,
                    state[k, 3])
    while state[0, 0] < offsets.shape[0] - 1:
        r = state[0, 0]
        state[0, 0] += 1
        if offsets[r + 1] - offsets[r] >= block_size:
            state[k, 1], state[k, 2], state[k, 3] = offsets[r], offsets[r + 1], key_offsets[r]
            state[k, 4] = np.int64(root)
            return True
        _chain_into(tokens, offsets[r], offsets[r + 1], block_size, root, partial_tail, keys, key_offsets[r])
    state[k, 1] = state[k, 2] = 0
    return False


@kernel_jit
def _chain_batch(offsets, tokens, block_size, seed, partial_tail):  # noqa: ANN001, ANN202
    """CSR keys of every prompt: ``(key_offsets int64[p + 1], keys uint64)``; full blocks
    of :data:`_STREAMS` prompts at a time, token by token side by side."""
    num_prompts = offsets.shape[0] - 1
    key_offsets = np.empty(num_prompts + 1, np.int64)
    key_offsets[0] = 0
    for r in range(num_prompts):
        key_offsets[r + 1] = key_offsets[r] + _num_keys(offsets[r + 1] - offsets[r], block_size, partial_tail)
    keys = np.empty(key_offsets[num_prompts], np.uint64)
    root = _fmix64(seed ^ _K_ROOT)
    # state[k] = (next prompt (row 0 only), token position, prompt end, key position, chain value)
    state = np.zeros((_STREAMS + 1, 5), np.int64)
    streams = np.arange(1, _STREAMS + 1)
    active = True
    for k in streams:
        active &= _next_prompt(k, state, offsets, tokens, block_size, root, partial_tail, keys, key_offsets)
    length = np.uint64(block_size)
    while active:
        # unsigned indices: numba then skips the negative-index fix-up on every load
        s0, s1, s2, s3 = np.uint64(state[1, 1]), np.uint64(state[2, 1]), np.uint64(state[3, 1]), np.uint64(state[4, 1])
        e0, e1, e2, e3 = (np.uint64(state[1, 4]) ^ _K_PARENT, np.uint64(state[2, 4]) ^ _K_PARENT,
                          np.uint64(state[3, 4]) ^ _K_PARENT, np.uint64(state[4, 4]) ^ _K_PARENT)
        o0, o1, o2, o3 = (np.uint64(state[1, 4]) ^ _K_ROOT, np.uint64(state[2, 4]) ^ _K_ROOT,
                          np.uint64(state[3, 4]) ^ _K_ROOT, np.uint64(state[4, 4]) ^ _K_ROOT)
        end0 = s0 + length - np.uint64(1)
        while s0 < end0:
            e0 = _rot((e0 ^ np.uint64(tokens[s0])) * _MUL, 31)
            e1 = _rot((e1 ^ np.uint64(tokens[s1])) * _MUL, 31)
            e2 = _rot((e2 ^ np.uint64(tokens[s2])) * _MUL, 31)
            e3 = _rot((e3 ^ np.uint64(tokens[s3])) * _MUL, 31)
            o0 = _rot((o0 ^ np.uint64(tokens[s0 + np.uint64(1)])) * _MUL2, 29)
            o1 = _rot((o1 ^ np.uint64(tokens[s1 + np.uint64(1)])) * _MUL2, 29)
            o2 = _rot((o2 ^ np.uint64(tokens[s2 + np.uint64(1)])) * _MUL2, 29)
            o3 = _rot((o3 ^ np.uint64(tokens[s3 + np.uint64(1)])) * _MUL2, 29)
            s0, s1, s2, s3 = s0 + np.uint64(2), s1 + np.uint64(2), s2 + np.uint64(2), s3 + np.uint64(2)
        if s0 == end0:  # an odd block size: the last token
            e0 = _rot((e0 ^ np.uint64(tokens[s0])) * _MUL, 31)
            e1 = _rot((e1 ^ np.uint64(tokens[s1])) * _MUL, 31)
            e2 = _rot((e2 ^ np.uint64(tokens[s2])) * _MUL, 31)
            e3 = _rot((e3 ^ np.uint64(tokens[s3])) * _MUL, 31)
        h0, h1 = _fmix64(e0 ^ _rot(o0, 17) ^ length), _fmix64(e1 ^ _rot(o1, 17) ^ length)
        h2, h3 = _fmix64(e2 ^ _rot(o2, 17) ^ length), _fmix64(e3 ^ _rot(o3, 17) ^ length)
        keys[state[1, 3]], keys[state[2, 3]], keys[state[3, 3]], keys[state[4, 3]] = h0, h1, h2, h3
        state[1, 4], state[2, 4], state[3, 4], state[4, 4] = np.int64(h0), np.int64(h1), np.int64(h2), np.int64(h3)
        for k in streams:
            state[k, 1] += block_size
            state[k, 3] += 1
            if state[k, 2] - state[k, 1] < block_size:
                active &= _next_prompt(k, state, offsets, tokens, block_size, root, partial_tail, keys,
                                       key_offsets)
    for k in streams:  # the prompts left in flight, one by one
        if state[k, 1] < state[k, 2]:
            _chain_into(tokens, state[k, 1], state[k, 2], block_size, np.uint64(state[k, 4]), partial_tail, keys,
                        state[k, 3])
    return key_offsets, keys


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


def chain_u64_batch(offsets: Sequence[int] | np.ndarray, token_ids: Sequence[int] | np.ndarray, block_size: int,
                    seed: int = 0, *, partial_tail: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """:func:`chain_u64` of many prompts in one call, CSR in and CSR out (numba).

    Prompt ``r`` is ``token_ids[offsets[r]:offsets[r + 1]]``; its keys are
    ``keys[key_offsets[r]:key_offsets[r + 1]]``, equal to ``chain_u64(prompt, block_size,
    seed, partial_tail=partial_tail)``. One call costs no fixed overhead per prompt.

    Args:
        offsets: ``int[num_prompts + 1]``, non-decreasing, from 0 to ``len(token_ids)``.
        token_ids: ``int[n]`` token ids of all prompts back to back (≥ 0, < 2^64);
            ``int64`` and ``uint64`` arrays are read without a copy.
        block_size: tokens per block.
        seed: root seed (``0 <= seed < 2^64``).
        partial_tail: also key each prompt's trailing partial block.

    Returns:
        ``(key_offsets int64[num_prompts + 1], keys uint64[key_offsets[-1]])``.

    Raises:
        ValueError: bad offsets, token ids, block size or seed.

    Example:
        >>> key_offsets, keys = chain_u64_batch([0, 40, 72], list(range(40)) + list(range(32)), 16)
        >>> key_offsets.tolist()
        [0, 2, 4]
        >>> keys[2:4].tolist() == chain_u64(range(32), 16).tolist()
        True
    """
    tokens = as_token_array(token_ids)
    block_size = check_block_size(block_size)
    seed = check_u64("seed", seed)
    partial_tail = check_flag("partial_tail", partial_tail)
    offsets = np.asarray(offsets)
    if offsets.ndim != 1 or offsets.shape[0] < 1 or offsets.dtype.kind not in "iu":
        raise ValueError(f"offsets must be a one-dimensional integer array of num_prompts + 1 entries, "
                         f"got {offsets.dtype} {offsets.shape}")
    offsets = offsets.astype(np.int64, copy=False)
    if offsets[0] != 0 or offsets[-1] != tokens.shape[0] or (offsets[1:] < offsets[:-1]).any():
        raise ValueError(f"offsets must be non-decreasing from 0 to len(token_ids) = {tokens.shape[0]}, "
                         f"got {offsets[0]} ... {offsets[-1]}")
    return _chain_batch(offsets, tokens, block_size, np.uint64(seed), partial_tail)


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
