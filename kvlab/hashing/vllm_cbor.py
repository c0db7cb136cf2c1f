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

The kernel writes these bytes and hashes them through libcrypto (:mod:`.libcrypto`),
block after block, the parent being the previous digest.
"""

from __future__ import annotations

import numpy as np

from kvlab.core.jit import kernel_jit
from kvlab.hashing.libcrypto import CTX_BYTES, load_u64, sha256_digest, sha256_functions, store_u64
from kvlab.hashing.vllm_pickle import digest_list

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


@kernel_jit(nogil=True)
def _sha256_cbor_chain(blocks, parent, functions):  # noqa: ANN001, ANN202 - numba kernel
    """Chained ``sha256_cbor`` digests (``uint8[n, 32]``) of ``blocks`` (``uint64[n, B]``)
    after ``parent`` (``uint8[32]``), through libcrypto."""
    num_blocks, block_size = blocks.shape
    buf = np.zeros(_HEAD + 32 + 9 + 9 * block_size + 16, np.uint8)
    ctx = np.zeros(CTX_BYTES, np.uint8)
    digests = np.empty((num_blocks, 32), np.uint8)
    buf[0], buf[1], buf[2] = 0x83, 0x58, 32
    buf[_HEAD:_HEAD + 32] = parent
    base, c, out = np.uint64(buf.ctypes.data), np.uint64(ctx.ctypes.data), np.uint64(digests.ctypes.data)
    start = _write_head(base, _HEAD + 32, 0x80, np.uint64(block_size))
    for b in range(num_blocks):
        p = start
        for i in range(block_size):
            p = _write_head(base, p, 0x00, blocks[b, i])
        buf[p] = 0xF6
        digest = out + np.uint64(32 * b)
        sha256_digest(functions, c, base, p + 1, digest)
        for k in range(4):
            store_u64(base + np.uint64(_HEAD + 8 * k), load_u64(digest + np.uint64(8 * k)))
    return digests


def chain_sha256_cbor(parent: bytes, blocks: np.ndarray) -> list[bytes] | None:
    """Chained vLLM ``sha256_cbor`` block hashes of consecutive blocks without extra keys.

    Equal to ``h_i = sha256(cbor2.dumps((h_{i-1}, tuple(blocks[i]), None),
    canonical=True))`` with ``h_{-1} = parent`` (vLLM 0.33 ``hash_block_tokens``,
    docs/specs/hashing.md §1.4), the bytes written and hashed in one kernel.

    Args:
        parent: the previous block's 32-byte hash, or NONE_HASH for the first block.
        blocks: ``uint64[num_blocks, block_size]`` token ids.

    Returns:
        ``num_blocks`` 32-byte digests; ``None`` when libcrypto is unavailable (see
        :mod:`.libcrypto`: the caller then serialises with ``cbor2``).

    Raises:
        ValueError: ``parent`` not 32 bytes, or ``blocks`` not a 2-D ``uint64`` array.

    Example:
        >>> import cbor2, hashlib
        >>> row = (1, 300, 70000, 2**40)
        >>> want = hashlib.sha256(cbor2.dumps((bytes(32), row, None), canonical=True)).digest()
        >>> chain_sha256_cbor(bytes(32), np.array([row], np.uint64)) in ([want], None)
        True
    """
    if not isinstance(parent, bytes) or len(parent) != 32:
        raise ValueError(f"parent must be a 32-byte sha256 digest, got {parent!r}")
    if not isinstance(blocks, np.ndarray) or blocks.dtype != np.uint64 or blocks.ndim != 2:
        raise ValueError(f"blocks must be a uint64[num_blocks, block_size] array, got "
                         f"{getattr(blocks, 'dtype', type(blocks).__name__)} {getattr(blocks, 'shape', '')}")
    functions = sha256_functions()
    if functions is None:
        return None
    if blocks.shape[0] == 0:
        return []
    return digest_list(_sha256_cbor_chain(np.ascontiguousarray(blocks), np.frombuffer(parent, np.uint8), functions))
