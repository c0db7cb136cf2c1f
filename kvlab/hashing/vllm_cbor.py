"""vLLM's ``sha256_cbor`` block hashes of blocks without extra keys, in one numba kernel.

With ``--prefix-caching-hash-algo sha256_cbor`` a block hash is
``sha256(cbor2.dumps((parent, tuple(block_tokens), None), canonical=True))``
(``kv_cache_utils.hash_block_tokens``; docs/specs/hashing.md §1.2, §1.4). Canonical CBOR
of that payload (RFC 8949 §4.2.1, shortest forms)::

    83                     array of 3
    58 20 <parent>         byte string of 32 bytes
    <array head>           80+B (B < 24), 98 <u8>, 99 <u16 BE>, 9a <u32 BE>
    <each token>           00..17 itself; 18 <u8>; 19 <u16 BE>; 1a <u32 BE>; 1b <u64 BE>
    f6                     null

The kernel writes these bytes and hashes them (:mod:`.sha_ni`: the CPU's SHA extensions
or libcrypto), block after block, the parent being the previous digest.
"""

from __future__ import annotations

import numpy as np

from kvlab.core.jit import kernel_jit
from kvlab.hashing.libcrypto import store_u64
from kvlab.hashing.sha_ni import engine_functions, pad_sha256, sha256_engine, sha256_spliced
from kvlab.hashing.vllm_pickle import chain_buffers, check_chain_input, digest_list

#: Bytes before the parent: array of 3, byte string of 32.
_HEAD = 3


@kernel_jit(nogil=True)
def _bswap(v, num_bytes):  # noqa: ANN001, ANN202 - numba helper
    """The low ``num_bytes`` bytes of ``v`` (``uint64``) in big-endian order, as the low
    bytes of the result (so a little-endian store writes them big-endian)."""
    out = np.uint64(0)
    for k in range(num_bytes):
        out |= ((v >> np.uint64(8 * k)) & np.uint64(0xFF)) << np.uint64(8 * (num_bytes - 1 - k))
    return out


@kernel_jit(nogil=True)
def _write_head(base, p, major, n):  # noqa: ANN001, ANN202 - numba helper
    """A CBOR head of major type ``major`` (``0x00`` integer, ``0x80`` array) with
    argument ``n`` at ``base + p``, shortest form, one 8- or 2-store; returns the end."""
    at = base + np.uint64(p)
    if n < 24:
        store_u64(at, np.uint64(major) | n)
        return p + 1
    if n < 256:
        store_u64(at, np.uint64(major | 0x18) | (n << np.uint64(8)))
        return p + 2
    if n < 65536:
        store_u64(at, np.uint64(major | 0x19) | (_bswap(n, 2) << np.uint64(8)))
        return p + 3
    if n < 4294967296:
        store_u64(at, np.uint64(major | 0x1A) | (_bswap(n, 4) << np.uint64(8)))
        return p + 5
    store_u64(at, np.uint64(major | 0x1B))
    store_u64(at + np.uint64(1), _bswap(n, 8))
    return p + 9


#: Blocks whose token words :func:`_cbor_words` writes at a time (they stay in L1).
_WORD_BLOCKS = 64
_U32_END = 1 << 32


@kernel_jit(nogil=True)
def _cbor_words(tokens, start, words):  # noqa: ANN001, ANN202 - numba helper
    """The CBOR of each token (all below ``2**32``) of ``tokens[start:start + len(words)]``
    as one ``uint64`` into ``words``: head and argument big-endian, its length (1, 2, 3 or
    5 bytes) in the top byte. No dependency between tokens: LLVM vectorises it."""
    n = min(words.shape[0], tokens.shape[0] - start)
    chunk = tokens[start:start + n]
    for i in range(n):
        v = np.uint64(chunk[i])
        one = np.uint64(v > np.uint64(23))
        two = np.uint64(v > np.uint64(255))
        four = np.uint64(v > np.uint64(65535))
        be16 = ((v & np.uint64(0xFF)) << np.uint64(8)) | (v >> np.uint64(8))
        be32 = (((v & np.uint64(0xFF)) << np.uint64(24)) | ((v & np.uint64(0xFF00)) << np.uint64(8))
                | ((v >> np.uint64(8)) & np.uint64(0xFF00)) | (v >> np.uint64(24)))
        argument = be32 if four else (be16 if two else v)
        word = ((np.uint64(0x17) + one + two + four) | (argument << np.uint64(8))) if one else v
        words[i] = word | ((np.uint64(1) + one + two + (four << np.uint64(1))) << np.uint64(56))


@kernel_jit(nogil=True)
def _sha256_cbor_chain(blocks, parent, long_ints, functions):  # noqa: ANN001, ANN202 - numba kernel
    """Chained ``sha256_cbor`` digests (``uint8[n, 32]``) of ``blocks`` (``uint64[n, B]``)
    after ``parent`` (``uint8[32]``); ``long_ints`` is ``None`` when every token is below
    ``2**32`` (one store per token from :func:`_cbor_words`), ``functions`` the SHA-256
    engine of :func:`~kvlab.hashing.sha_ni.sha256_spliced`. As in the pickle kernel, block
    ``b`` is written while block ``b - 1`` is hashed, in two buffers taking turns."""
    num_blocks, block_size = blocks.shape
    size = (_HEAD + 32 + 9 + 9 * block_size + 16 + 72) // 64 * 64 + 64
    bufs, ctx, digests, words = chain_buffers(num_blocks, size, _WORD_BLOCKS * block_size, parent)
    tokens = blocks.reshape(-1)
    first, c, out = np.uint64(bufs.ctypes.data), np.uint64(ctx.ctypes.data), np.uint64(digests.ctypes.data)
    start = 0
    for k in range(2):
        bufs[k, 0], bufs[k, 1], bufs[k, 2] = 0x83, 0x58, 32
        start = _write_head(first + np.uint64(k * size), _HEAD + 32, 0x80, np.uint64(block_size))
    end = chunks = following_end = following_chunks = 0
    for b in range(num_blocks + 1):
        if b < num_blocks:  # block b's bytes
            base = first + np.uint64((b & 1) * size)
            p = start
            if long_ints is None:
                if b % _WORD_BLOCKS == 0:
                    _cbor_words(tokens, b * block_size, words)
                for i in range((b % _WORD_BLOCKS) * block_size, (b % _WORD_BLOCKS + 1) * block_size):
                    store_u64(base + np.uint64(p), words[i])
                    p += np.int64(words[i] >> np.uint64(56))
            else:
                for i in range(block_size):
                    p = _write_head(base, p, 0x00, blocks[b, i])
            bufs[b & 1, p] = 0xF6
            following_end = p + 1
            following_chunks = pad_sha256(base, following_end)
        if b > 0:  # block b - 1's digest
            sha256_spliced(functions, c, first + np.uint64(((b - 1) & 1) * size), end, chunks,
                           out + np.uint64(32 * (b - 1)), out + np.uint64(32 * b), _HEAD)
        end, chunks = following_end, following_chunks
    return digests[1:]


def sha256_cbor_chain_array(parent: bytes, blocks: np.ndarray) -> np.ndarray | None:
    """Chained vLLM ``sha256_cbor`` block hashes of consecutive blocks without extra keys,
    as one array.

    Row ``i`` is ``sha256(cbor2.dumps((h_{i-1}, tuple(blocks[i]), None), canonical=True))``
    with ``h_{-1} = parent`` (vLLM 0.33 ``hash_block_tokens``, docs/specs/hashing.md §1.4),
    the bytes written and hashed in one kernel.

    Args:
        parent: the previous block's 32-byte hash, or NONE_HASH for the first block.
        blocks: ``uint64[num_blocks, block_size]`` token ids.

    Returns:
        ``uint8[num_blocks, 32]``; ``None`` when no SHA-256 engine is available (see
        :func:`~kvlab.hashing.sha_ni.sha256_engine`: the caller then serialises with ``cbor2``).

    Raises:
        ValueError: ``parent`` not 32 bytes, or ``blocks`` not a 2-D ``uint64`` array.

    Example:
        >>> import cbor2, hashlib
        >>> row = (1, 300, 70000, 2**40)
        >>> want = hashlib.sha256(cbor2.dumps((bytes(32), row, None), canonical=True)).digest()
        >>> out = sha256_cbor_chain_array(bytes(32), np.array([row], np.uint64))
        >>> out is None or out[0].tobytes() == want
        True
    """
    check_chain_input(parent, blocks)
    engine = sha256_engine()
    if engine is None:
        return None
    blocks = np.ascontiguousarray(blocks)
    long_ints = True if blocks.size and int(blocks.max()) >= _U32_END else None
    return _sha256_cbor_chain(blocks, np.frombuffer(parent, np.uint8), long_ints, engine_functions(engine))


def chain_sha256_cbor(parent: bytes, blocks: np.ndarray) -> list[bytes] | None:
    """:func:`sha256_cbor_chain_array` as a list of 32-byte digests (vLLM's ``BlockHash``
    values); ``None`` when no SHA-256 engine is available.

    Raises:
        ValueError: ``parent`` not 32 bytes, or ``blocks`` not a 2-D ``uint64`` array.
    """
    digests = sha256_cbor_chain_array(parent, blocks)
    return None if digests is None else digest_list(digests)
