"""vLLM's pickle-based block hashes of blocks without extra keys, fast and byte-exact.

With ``--prefix-caching-hash-algo sha256`` (vLLM's default) or ``xxhash``, a block hash is
``digest(pickle.dumps((parent, tuple(block_tokens), None), protocol=5))``
(``kv_cache_utils.hash_block_tokens``; docs/specs/hashing.md §1.2, §1.4). Calling
``pickle.dumps`` per block costs more than the digest itself, so this module writes the
exact pickle bytes of all blocks at once (a numba kernel) and leaves only
``digest(prefix_i + parent + suffix_i)`` in the per-block Python loop. The bytes CPython's
C pickler writes for that payload (check with ``pickletools.dis``)::

    80 05                  PROTO 5
    95 <u64 LE>            FRAME: byte count of everything after this header
    43 <len> <parent>      SHORT_BINBYTES parent (32 bytes; 16 for xxhash)
    94                     MEMOIZE
    28 ... 74              MARK, the tokens, TUPLE   (1-3 tokens: tokens, then TUPLE1/2/3)
      4b <u8>              BININT1  for t < 2**8
      4d <u16 LE>          BININT2  for t < 2**16
      4a <i32 LE>          BININT   for t < 2**31
      8a <n> <n bytes LE>  LONG1    above (minimal two's complement, so 2**31 takes 5 bytes)
    94                     MEMOIZE
    4e 87 94 2e            NONE, TUPLE3, MEMOIZE, STOP

One FRAME holds the whole pickle while it stays below 64 KiB (``FRAME_SIZE_TARGET`` of
``_pickle.c``, which starts a new frame at the first opcode boundary past it); blocks that
whose pickle reaches it (thousands of tokens) are hashed with ``pickle.dumps`` itself.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np

from kvlab.core.jit import kernel_jit
from kvlab.core.validate import check_choice, check_int
from kvlab.hashing.digests import digester, hash_fn
from kvlab.hashing.libcrypto import CTX_BYTES, load_u64, sha256_digest, sha256_functions, store_u64

#: CPython's ``_pickle.c`` ``FRAME_SIZE_TARGET``: frames are split once they reach it.
FRAME_SIZE_TARGET = 64 * 1024
#: The hash algos that serialise with pickle (the others use CBOR).
PICKLE_ALGOS = ("sha256", "xxhash")
#: Blocks pickled per kernel call: their bytes are still in the CPU cache when digested.
_CHUNK_BLOCKS = 4096
_LONG1_FROM = 1 << 31


@kernel_jit(nogil=True)
def _long1_bytes(t):  # noqa: ANN001, ANN202 - numba helper
    """Length of ``t >= 2**31`` as a minimal positive two's-complement integer (5..9)."""
    n = 5
    while n < 9 and (t >> np.uint64(8 * n - 1)) > 0:
        n += 1
    return n


@kernel_jit(nogil=True)
def _suffix_length(row, long_ints):  # noqa: ANN001, ANN202 - numba helper
    """Bytes of a block's pickle after the parent (see :func:`_write_suffix`)."""
    length = (1 if row.shape[0] <= 3 else 2) + 6
    for i in range(row.shape[0]):
        t = row[i]
        if long_ints is not None and t >= _LONG1_FROM:
            length += 2 + _long1_bytes(t)
        else:
            v = np.int64(t)
            c = np.int64(v >= 256) + np.int64(v >= 65536)
            length += 2 + c + (c >> 1)
    return length


@kernel_jit(nogil=True)
def _write_suffix(out, p, row, long_ints):  # noqa: ANN001, ANN202 - numba helper
    """Write the pickle bytes after the parent of the block ``row`` (``uint64[B]``) at
    ``out[p:]``, return the end. ``long_ints`` is ``None`` when every token is
    below ``2**31``: numba then prunes the LONG1 branches, which otherwise halve the speed.
    """
    block_size = row.shape[0]
    out[p] = 0x94  # MEMOIZE the parent
    out[p + 1] = 0x28  # MARK (overwritten by the first token when B <= 3)
    p += 1 if block_size <= 3 else 2
    for i in range(block_size):
        t = row[i]
        if long_ints is not None and t >= _LONG1_FROM:
            n = _long1_bytes(t)
            out[p] = 0x8A
            out[p + 1] = n
            for k in range(n):  # a 9th byte is the zero sign byte
                out[p + 2 + k] = (t >> np.uint64(8 * k)) & np.uint64(0xFF) if k < 8 else 0
            p += 2 + n
            continue
        # BININT1/2/BININT (c = 0, 1, 2: 2, 3, 5 bytes); opcode + 4 bytes are written
        # always, the next token or the tail overwrites the excess. (Inlined by hand:
        # a helper function halves the speed.)
        v = np.int64(t)
        c = np.int64(v >= 256) + np.int64(v >= 65536)
        out[p] = 0x4B + 2 * c - 5 * (c >> 1)  # 0x4b, 0x4d, 0x4a
        out[p + 1] = v & 0xFF
        out[p + 2] = (v >> 8) & 0xFF
        out[p + 3] = (v >> 16) & 0xFF
        out[p + 4] = v >> 24
        p += 2 + c + (c >> 1)
    out[p] = 0x74 if block_size > 3 else 0x84 + block_size  # TUPLE / TUPLE1-3
    out[p + 1] = 0x94
    out[p + 2] = 0x4E
    out[p + 3] = 0x87
    out[p + 4] = 0x94
    out[p + 5] = 0x2E
    return p + 6


@kernel_jit(nogil=True)
def _write_pickles(blocks, parent_len, long_ints):  # noqa: ANN001, ANN202 - numba kernel
    """Each block's FRAME length (``int64[n]``) and pickle bytes after the parent
    (``uint8[n, width]``, left-aligned, zero-padded; ``width`` = the longest).

    ``blocks`` is ``uint64[n, B]``; ``long_ints`` as in :func:`_write_suffix`.
    """
    num_blocks = blocks.shape[0]
    frames = np.empty(num_blocks, np.int64)
    width = 0
    for b in range(num_blocks):
        length = _suffix_length(blocks[b], long_ints)
        frames[b] = 2 + parent_len + length
        width = max(width, length)
    suffixes = np.zeros((num_blocks, width), np.uint8)
    for b in range(num_blocks):
        _write_suffix(suffixes[b], 0, blocks[b], long_ints)
    return frames, suffixes


#: Bytes of the pickle before the parent: PROTO, FRAME and its length, SHORT_BINBYTES.
_HEAD = 13


@kernel_jit(nogil=True)
def _write_suffix_wide(base, p, row):  # noqa: ANN001, ANN202 - numba helper
    """:func:`_write_suffix` for tokens below ``2**31`` at address ``base + p``, one 8-byte
    store per token (opcode and value; the next store overwrites the excess), so the
    buffer needs 8 bytes of slack. Returns the end offset."""
    block_size = row.shape[0]
    store_u64(base + np.uint64(p), np.uint64(0x2894))  # MEMOIZE the parent, MARK
    p += 1 if block_size <= 3 else 2
    for i in range(block_size):
        v = np.uint64(row[i])
        c = np.uint64(v >= np.uint64(256)) + np.uint64(v >= np.uint64(65536))
        opcode = np.uint64(0x4B) + np.uint64(2) * c - np.uint64(5) * (c >> np.uint64(1))  # 0x4b, 0x4d, 0x4a
        store_u64(base + np.uint64(p), opcode | (v << np.uint64(8)))
        p += 2 + np.int64(c) + np.int64(c >> np.uint64(1))
    tuple_op = 0x74 if block_size > 3 else 0x84 + block_size  # TUPLE / TUPLE1-3
    # TUPLE, MEMOIZE, NONE, TUPLE3, MEMOIZE, STOP
    store_u64(base + np.uint64(p), np.uint64(tuple_op) | np.uint64(0x2E94874E9400))
    return p + 6


@kernel_jit(nogil=True)
def _sha256_chain(blocks, parent, long_ints, functions):  # noqa: ANN001, ANN202 - numba kernel
    """Chained sha256 of the blocks' pickles after ``parent`` (``uint8[32]``) through
    libcrypto: ``(digests uint8[n, 32], num_done)``; ``num_done < n`` when block
    ``num_done`` needs a second FRAME (its digest and the later ones not written).

    Two buffers take turns: block ``b + 1``'s tokens are written while the CPU is still
    finishing block ``b``'s SHA-256 (they do not depend on it), then its parent is copied in.
    """
    num_blocks, block_size = blocks.shape
    size = _HEAD + 32 + 8 + 11 * block_size + 16
    bufs = np.zeros((2, size), np.uint8)
    ctx = np.zeros(CTX_BYTES, np.uint8)
    digests = np.empty((num_blocks, 32), np.uint8)
    for k in range(2):
        bufs[k, 0], bufs[k, 1], bufs[k, 2], bufs[k, 11], bufs[k, 12] = 0x80, 0x05, 0x95, 0x43, 32
    bufs[0, _HEAD:_HEAD + 32] = parent
    bases = (np.uint64(bufs.ctypes.data), np.uint64(bufs.ctypes.data) + np.uint64(size))
    c, out = np.uint64(ctx.ctypes.data), np.uint64(digests.ctypes.data)
    end = 0
    if num_blocks:
        end = (_write_suffix_wide(bases[0], _HEAD + 32, blocks[0]) if long_ints is None
               else _write_suffix(bufs[0], _HEAD + 32, blocks[0], long_ints))
    for b in range(num_blocks):
        base, following = bases[b & 1], bases[(b + 1) & 1]
        frame = end - 11
        if frame >= FRAME_SIZE_TARGET:
            return digests, b
        store_u64(base + np.uint64(3), np.uint64(frame))
        digest = out + np.uint64(32 * b)
        sha256_digest(functions, c, base, end, digest)
        if b + 1 < num_blocks:
            end = (_write_suffix_wide(following, _HEAD + 32, blocks[b + 1]) if long_ints is None
                   else _write_suffix(bufs[(b + 1) & 1], _HEAD + 32, blocks[b + 1], long_ints))
            for k in range(4):
                store_u64(following + np.uint64(_HEAD + 8 * k), load_u64(digest + np.uint64(8 * k)))
    return digests, num_blocks


@lru_cache(maxsize=8)
def _prefix_table(parent_len: int, num_frames: int) -> np.ndarray:
    """``object[num_frames]``: the pickle's bytes before the parent, by FRAME length."""
    return np.array([b"\x80\x05\x95" + frame.to_bytes(8, "little") + b"C" + bytes([parent_len])
                     for frame in range(num_frames)], dtype=object)


def pickle_parts(blocks: np.ndarray, parent_len: int) -> tuple[list[bytes], list[bytes]] | None:
    """Per block, the bytes before and after the parent in vLLM's pickled payload.

    ``prefixes[i] + parent + suffixes[i] == pickle.dumps((parent, tuple(blocks[i]), None),
    protocol=5)`` for any ``parent`` of ``parent_len`` bytes (models the payload of vLLM
    0.33 ``hash_block_tokens`` for a block without extra keys; docs/specs/hashing.md §1.4).

    Args:
        blocks: ``uint64[num_blocks, block_size]`` token ids, ``block_size >= 1``.
        parent_len: length of the parent hash in bytes (32 for sha256, 16 for xxhash).

    Returns:
        ``(prefixes, suffixes)``, two lists of ``num_blocks`` bytes objects; ``None`` when a
        block's pickle would need a second frame (see :data:`FRAME_SIZE_TARGET`).

    Raises:
        ValueError: ``blocks`` not a 2-D ``uint64`` array with at least one column, or
            ``parent_len`` outside ``1..255``.

    Example:
        >>> import pickle
        >>> prefixes, suffixes = pickle_parts(np.array([[1, 300, 70000, 2**40]], np.uint64), 32)
        >>> payload = (bytes(32), (1, 300, 70000, 2**40), None)
        >>> prefixes[0] + bytes(32) + suffixes[0] == pickle.dumps(payload, protocol=5)
        True
    """
    if not isinstance(blocks, np.ndarray) or blocks.dtype != np.uint64 or blocks.ndim != 2 or blocks.shape[1] < 1:
        raise ValueError(f"blocks must be a uint64[num_blocks, block_size >= 1] array, got "
                         f"{getattr(blocks, 'dtype', type(blocks).__name__)} {getattr(blocks, 'shape', '')}")
    parent_len = check_int("parent_len", parent_len, low=1, high=255)
    if blocks.shape[0] == 0:
        return [], []
    long_ints = True if int(blocks.max()) >= _LONG1_FROM else None
    frames, suffixes = _write_pickles(np.ascontiguousarray(blocks), parent_len, long_ints)
    max_frame = int(frames.max())
    if max_frame >= FRAME_SIZE_TARGET:
        return None
    prefixes = _prefix_table(parent_len, 1 << max_frame.bit_length())[frames]  # few sizes, shared objects
    # As a fixed-width bytes item a row drops its trailing zeros; every suffix ends in
    # STOP (0x2e), so tolist() yields the exact suffixes.
    return prefixes.tolist(), suffixes.view(f"S{suffixes.shape[1]}").ravel().tolist()


def chain_without_extras(algo: str, parent: bytes, blocks: np.ndarray) -> list[bytes]:
    """Chained vLLM block hashes of consecutive blocks that have no extra keys.

    Equal to ``h_i = hash_fn(algo)((h_{i-1}, tuple(blocks[i]), None))`` with
    ``h_{-1} = parent`` (vLLM 0.33 ``hash_block_tokens``, docs/specs/hashing.md §1.4), but
    the pickles are written by a kernel (:func:`pickle_parts`), a chunk of blocks at a
    time.

    Args:
        algo: ``"sha256"`` or ``"xxhash"`` (the pickle-based algos).
        parent: the previous block's hash, or NONE_HASH for the first block.
        blocks: ``uint64[num_blocks, block_size]`` token ids.

    Returns:
        ``num_blocks`` digests (32 bytes for sha256, 16 for xxhash).

    Raises:
        ValueError: ``algo`` not pickle-based, or bad ``blocks``.

    Example:
        >>> root = hash_fn("sha256")("vllm-none-hash")
        >>> chain_without_extras("sha256", root, np.array([[1, 2, 3, 4]], np.uint64))[0].hex()[:16]
        '52a7f141c60918f6'
    """
    check_choice("algo", algo, PICKLE_ALGOS)  # the pickle-based ones
    functions = sha256_functions() if algo == "sha256" and len(parent) == 32 else None
    if functions is not None:
        return _chain_libcrypto(parent, blocks, functions)
    sha256, digest, hash_obj = hashlib.sha256, digester(algo), hash_fn(algo)
    hashes: list[bytes] = []
    h = parent
    for a in range(0, blocks.shape[0], _CHUNK_BLOCKS):
        chunk = blocks[a:a + _CHUNK_BLOCKS]
        parts = pickle_parts(chunk, len(parent))
        if parts is None:  # a pickle of two frames: let pickle write it
            hashes += [h := hash_obj((h, tuple(row), None)) for row in chunk.tolist()]
        elif algo == "sha256":  # inlined: a digest callable per block would cost ~15% of the loop
            hashes += [h := sha256(p + h + s).digest() for p, s in zip(*parts)]
        else:
            hashes += [h := digest(p + h + s) for p, s in zip(*parts)]
    return hashes


def _chain_libcrypto(parent: bytes, blocks: np.ndarray, functions: np.ndarray) -> list[bytes]:
    """:func:`chain_without_extras` for sha256, whole chain in one kernel call (a block
    needing a second FRAME is pickled by ``pickle`` itself)."""
    hash_obj, blocks = hash_fn("sha256"), np.ascontiguousarray(blocks)
    long_ints = True if blocks.size and int(blocks.max()) >= _LONG1_FROM else None
    hashes: list[bytes] = []
    h, a = parent, 0
    while a < blocks.shape[0]:
        digests, done = _sha256_chain(blocks[a:], np.frombuffer(h, np.uint8), long_ints, functions)
        hashes += digest_list(digests[:done])
        h = hashes[-1] if hashes else parent
        a += done
        if a < blocks.shape[0]:
            hashes.append(h := hash_obj((h, tuple(blocks[a].tolist()), None)))
            a += 1
    return hashes


def digest_list(digests: np.ndarray) -> list[bytes]:
    """The rows of ``uint8[n, 32]`` as bytes: numpy's ``S32`` items (fast) drop trailing
    zero bytes, so rows ending in 0x00 are taken whole."""
    out = digests.view("S32").ravel().tolist()
    for i in np.flatnonzero(digests[:, -1] == 0).tolist():
        out[i] = digests[i].tobytes()
    return out
