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


@kernel_jit
def _or_tokens(tokens, start, stop):  # noqa: ANN001, ANN202
    """Bitwise OR of ``tokens[start:stop]`` as ``int64`` (negative iff one token is)."""
    acc = np.int64(0)
    for i in range(start, stop):
        acc |= np.int64(tokens[i])
    return acc


@kernel_jit
def _key_short(tokens, start, stop, block_size, h, partial_tail, keys, pos):  # noqa: ANN001, ANN202
    """Key ``tokens[start:stop]`` (fewer than a block, or a prompt finished alone) from
    chain value ``h`` into ``keys[pos:]``; returns the OR of its tokens."""
    _chain_into(tokens, start, stop, block_size, h, partial_tail, keys, pos)
    return _or_tokens(tokens, start, stop)


@kernel_jit
def _take(r, offsets, tokens, block_size, root, partial_tail, keys, key_offsets):  # noqa: ANN001, ANN202
    """The next prompt from ``r`` with a full block: ``(r + 1, start, end of its full
    blocks, prompt end, key position, OR of the tokens of the prompts skipped)``, keying
    the prompts without a full block on the way; ``start = -1`` when none is left."""
    acc = np.int64(0)
    num_prompts = offsets.shape[0] - 1
    while r < num_prompts:
        start, stop = offsets[r], offsets[r + 1]
        full = (stop - start) // block_size * block_size
        if full > 0:
            return r + 1, start, start + full, stop, key_offsets[r], acc
        acc |= _key_short(tokens, start, stop, block_size, root, partial_tail, keys, key_offsets[r])
        r += 1
    return r, np.int64(-1), np.int64(-1), np.int64(-1), np.int64(-1), acc


@kernel_jit
def _chain_batch(offsets, tokens, block_size, seed, partial_tail):  # noqa: ANN001, ANN202
    """CSR keys of every prompt: ``(key_offsets int64[p + 1], keys uint64, OR of all
    tokens as int64)``; the full blocks of four prompts at a time, token by token side by
    side (their chains are independent, so the CPU overlaps the multiplications one chain
    alone waits on). Each stream's state lives in local variables (registers)."""
    num_prompts = offsets.shape[0] - 1
    key_offsets = np.empty(num_prompts + 1, np.int64)
    key_offsets[0] = 0
    for r in range(num_prompts):
        key_offsets[r + 1] = key_offsets[r] + _num_keys(offsets[r + 1] - offsets[r], block_size, partial_tail)
    keys = np.empty(key_offsets[num_prompts], np.uint64)
    root = _fmix64(seed ^ _K_ROOT)
    args = (offsets, tokens, block_size, root, partial_tail, keys, key_offsets)
    # per stream: token position, end of the full blocks, prompt end, key position, chain value
    r, s0, f0, t0, k0, acc = _take(0, *args)
    r, s1, f1, t1, k1, a = _take(r, *args)
    acc |= a
    r, s2, f2, t2, k2, a = _take(r, *args)
    acc |= a
    r, s3, f3, t3, k3, a = _take(r, *args)
    acc |= a
    h0 = h1 = h2 = h3 = root
    length = np.uint64(block_size)
    pairs = (block_size // 2) * 2
    while s0 >= 0 and s1 >= 0 and s2 >= 0 and s3 >= 0:
        e0, e1, e2, e3 = h0 ^ _K_PARENT, h1 ^ _K_PARENT, h2 ^ _K_PARENT, h3 ^ _K_PARENT
        o0, o1, o2, o3 = h0 ^ _K_ROOT, h1 ^ _K_ROOT, h2 ^ _K_ROOT, h3 ^ _K_ROOT
        # unsigned indices: numba then skips the negative-index fix-up on every load
        p0, p1, p2, p3 = np.uint64(s0), np.uint64(s1), np.uint64(s2), np.uint64(s3)
        for i in range(block_size):  # the sign check, vectorised by LLVM (a scalar OR per token costs 12 %)
            u = np.uint64(i)
            acc |= np.int64(tokens[p0 + u]) | np.int64(tokens[p1 + u]) | np.int64(tokens[p2 + u]) | np.int64(
                tokens[p3 + u])
        for i in range(0, pairs, 2):
            u = np.uint64(i)
            v = u + np.uint64(1)
            a0, a1, a2, a3 = tokens[p0 + u], tokens[p1 + u], tokens[p2 + u], tokens[p3 + u]
            b0, b1, b2, b3 = tokens[p0 + v], tokens[p1 + v], tokens[p2 + v], tokens[p3 + v]
            e0 = _rot((e0 ^ np.uint64(a0)) * _MUL, 31)
            e1 = _rot((e1 ^ np.uint64(a1)) * _MUL, 31)
            e2 = _rot((e2 ^ np.uint64(a2)) * _MUL, 31)
            e3 = _rot((e3 ^ np.uint64(a3)) * _MUL, 31)
            o0 = _rot((o0 ^ np.uint64(b0)) * _MUL2, 29)
            o1 = _rot((o1 ^ np.uint64(b1)) * _MUL2, 29)
            o2 = _rot((o2 ^ np.uint64(b2)) * _MUL2, 29)
            o3 = _rot((o3 ^ np.uint64(b3)) * _MUL2, 29)
        if pairs < block_size:  # an odd block size: the last token
            u = np.uint64(pairs)
            a0, a1, a2, a3 = tokens[p0 + u], tokens[p1 + u], tokens[p2 + u], tokens[p3 + u]
            e0 = _rot((e0 ^ np.uint64(a0)) * _MUL, 31)
            e1 = _rot((e1 ^ np.uint64(a1)) * _MUL, 31)
            e2 = _rot((e2 ^ np.uint64(a2)) * _MUL, 31)
            e3 = _rot((e3 ^ np.uint64(a3)) * _MUL, 31)
        h0, h1 = _fmix64(e0 ^ _rot(o0, 17) ^ length), _fmix64(e1 ^ _rot(o1, 17) ^ length)
        h2, h3 = _fmix64(e2 ^ _rot(o2, 17) ^ length), _fmix64(e3 ^ _rot(o3, 17) ^ length)
        keys[k0], keys[k1], keys[k2], keys[k3] = h0, h1, h2, h3
        s0, s1, s2, s3 = s0 + block_size, s1 + block_size, s2 + block_size, s3 + block_size
        k0, k1, k2, k3 = k0 + 1, k1 + 1, k2 + 1, k3 + 1
        if s0 == f0:  # the prompt's full blocks done: its partial tail, then the next prompt
            acc |= _key_short(tokens, s0, t0, block_size, h0, partial_tail, keys, k0)
            r, s0, f0, t0, k0, a = _take(r, *args)
            acc |= a
            h0 = root
        if s1 == f1:
            acc |= _key_short(tokens, s1, t1, block_size, h1, partial_tail, keys, k1)
            r, s1, f1, t1, k1, a = _take(r, *args)
            acc |= a
            h1 = root
        if s2 == f2:
            acc |= _key_short(tokens, s2, t2, block_size, h2, partial_tail, keys, k2)
            r, s2, f2, t2, k2, a = _take(r, *args)
            acc |= a
            h2 = root
        if s3 == f3:
            acc |= _key_short(tokens, s3, t3, block_size, h3, partial_tail, keys, k3)
            r, s3, f3, t3, k3, a = _take(r, *args)
            acc |= a
            h3 = root
    # the prompts left in flight, one by one (a stream without a prompt has s = -1)
    if s0 >= 0:
        acc |= _key_short(tokens, s0, t0, block_size, h0, partial_tail, keys, k0)
    if s1 >= 0:
        acc |= _key_short(tokens, s1, t1, block_size, h1, partial_tail, keys, k1)
    if s2 >= 0:
        acc |= _key_short(tokens, s2, t2, block_size, h2, partial_tail, keys, k2)
    if s3 >= 0:
        acc |= _key_short(tokens, s3, t3, block_size, h3, partial_tail, keys, k3)
    return key_offsets, keys, acc


#: Token array dtypes :func:`chain_u64_batch` hands to its kernel without a copy.
_KERNEL_DTYPES = (np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.uint32), np.dtype(np.uint64))


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
            contiguous ``int32``, ``int64``, ``uint32`` and ``uint64`` arrays are read
            without a copy or a separate check pass (the kernel checks for negative ids).
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
    # int32/int64/uint32/uint64 arrays go to the kernel as they are: it checks the
    # signed ones for negative ids on its one pass over the data
    fast = (isinstance(token_ids, np.ndarray) and token_ids.ndim == 1 and token_ids.dtype in _KERNEL_DTYPES
            and token_ids.flags.c_contiguous)
    tokens = token_ids if fast else as_token_array(token_ids)
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
    key_offsets, keys, ored = _chain_batch(offsets, tokens, block_size, np.uint64(seed), partial_tail)
    if ored < 0 and tokens.dtype.kind == "i":
        as_token_array(tokens)  # raises, naming the negative id
    return key_offsets, keys


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
