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
from kvlab.hashing.libcrypto import CTX_BYTES, store_u64
from kvlab.hashing.sha_ni import engine_functions, pad_sha256, sha256_engine, sha256_spliced

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


#: Blocks whose token words :func:`_binint_words` writes at a time (they stay in L1).
_WORD_BLOCKS = 64


@kernel_jit(nogil=True)
def _binint_words(tokens, start, words):  # noqa: ANN001, ANN202 - numba helper
    """The pickle of each token (all below ``2**31``) of ``tokens[start:start + len(words)]``
    as one ``uint64`` into ``words``: opcode (BININT1/2/BININT), value little-endian, and its
    length (2, 3 or 5 bytes) in the top byte. No dependency between tokens: LLVM vectorises it."""
    n = min(words.shape[0], tokens.shape[0] - start)
    chunk = tokens[start:start + n]
    for i in range(n):
        v = np.uint64(chunk[i])
        two = np.uint64(v > np.uint64(255))
        four = np.uint64(v > np.uint64(65535))
        opcode = np.uint64(0x4B) + (two << np.uint64(1)) - four * np.uint64(3)  # 0x4b, 0x4d, 0x4a
        length = np.uint64(2) + two + (four << np.uint64(1))  # 2, 3, 5
        words[i] = opcode | (v << np.uint64(8)) | (length << np.uint64(56))


@kernel_jit(nogil=True)
def _write_words(base, p, words, start, block_size):  # noqa: ANN001, ANN202 - numba helper
    """:func:`_write_suffix` for tokens below ``2**31`` at address ``base + p`` from their
    :func:`_binint_words` (``words[start:start + block_size]``): one 8-byte store per token,
    the next store overwriting the excess, so the buffer needs 8 bytes of slack. Returns
    the end offset."""
    store_u64(base + np.uint64(p), np.uint64(0x2894))  # MEMOIZE the parent, MARK
    p += 1 if block_size <= 3 else 2
    for i in range(block_size):
        w = words[start + i]
        store_u64(base + np.uint64(p), w)
        p += np.int64(w >> np.uint64(56))
    tuple_op = 0x74 if block_size > 3 else 0x84 + block_size  # TUPLE / TUPLE1-3
    # TUPLE, MEMOIZE, NONE, TUPLE3, MEMOIZE, STOP
    store_u64(base + np.uint64(p), np.uint64(tuple_op) | np.uint64(0x2E94874E9400))
    return p + 6


@kernel_jit(nogil=True)
def _sha256_chain(blocks, parent, long_ints, functions):  # noqa: ANN001, ANN202 - numba kernel
    """Chained sha256 of the blocks' pickles after ``parent`` (``uint8[32]``):
    ``(digests uint8[n, 32], num_done)``; ``num_done < n`` when block ``num_done`` needs a
    second FRAME (its digest and the later ones not written). ``functions``: the SHA-256
    engine of :func:`~kvlab.hashing.sha_ni.sha256_spliced`.

    Two buffers take turns: block ``b``'s pickle (its FRAME length and SHA-256 padding
    too) is written before block ``b - 1`` is hashed (it does not depend on it), so the CPU
    overlaps them; the parent is spliced in from the previous digest. (Written inline: a
    helper taking the arrays costs as much as the pickling.)
    """
    num_blocks, block_size = blocks.shape
    size = (_HEAD + 32 + 8 + 11 * block_size + 16 + 72) // 64 * 64 + 64
    bufs, ctx, digests, words = chain_buffers(num_blocks, size, _WORD_BLOCKS * block_size, parent)
    tokens = blocks.reshape(-1)
    for k in range(2):
        bufs[k, 0], bufs[k, 1], bufs[k, 2], bufs[k, 11], bufs[k, 12] = 0x80, 0x05, 0x95, 0x43, 32
    first, c, out = np.uint64(bufs.ctypes.data), np.uint64(ctx.ctypes.data), np.uint64(digests.ctypes.data)
    end = chunks = following_end = following_chunks = 0
    for b in range(num_blocks + 1):
        if b < num_blocks:  # block b's bytes
            base = first + np.uint64((b & 1) * size)
            if long_ints is None:
                if b % _WORD_BLOCKS == 0:
                    _binint_words(tokens, b * block_size, words)
                following_end = _write_words(base, _HEAD + 32, words, (b % _WORD_BLOCKS) * block_size, block_size)
            else:
                following_end = _write_suffix(bufs[b & 1], _HEAD + 32, blocks[b], long_ints)
            store_u64(base + np.uint64(3), np.uint64(following_end - 11))  # FRAME: bytes after its header
            following_chunks = pad_sha256(base, following_end)
        if b > 0:  # block b - 1's digest
            if end - 11 >= FRAME_SIZE_TARGET:
                return digests[1:], b - 1
            sha256_spliced(functions, c, first + np.uint64(((b - 1) & 1) * size), end, chunks,
                           out + np.uint64(32 * (b - 1)), out + np.uint64(32 * b), _HEAD)
        end, chunks = following_end, following_chunks
    return digests[1:], num_blocks


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
    if algo == "sha256" and len(parent) == 32:
        digests = sha256_chain_array(parent, blocks)
        if digests is not None:
            return digest_list(digests)
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


@kernel_jit(inline="always")
def chain_buffers(num_blocks: int, size: int, num_words: int, parent: np.ndarray) -> tuple:
    """Scratch of the sha256 chain kernels (pickle and CBOR): two ``size``-byte payload buffers
    taking turns (zeroed), the libcrypto context, the digests ``uint8[num_blocks + 1, 32]``
    (row 0: ``parent``) and ``uint64[num_words]`` for the encoded tokens."""
    digests = np.empty((num_blocks + 1, 32), np.uint8)
    digests[0] = parent
    return np.zeros((2, size), np.uint8), np.zeros(CTX_BYTES, np.uint8), digests, np.empty(num_words, np.uint64)


def check_chain_input(parent: object, blocks: object) -> None:
    """The arguments of the sha256 chain kernels (pickle and CBOR payloads).

    Raises:
        ValueError: ``parent`` not a 32-byte digest, or ``blocks`` not a 2-D ``uint64`` array.
    """
    if not isinstance(parent, bytes) or len(parent) != 32:
        raise ValueError(f"parent must be a 32-byte sha256 digest, got {parent!r}")
    if not isinstance(blocks, np.ndarray) or blocks.dtype != np.uint64 or blocks.ndim != 2:
        raise ValueError(f"blocks must be a uint64[num_blocks, block_size] array, got "
                         f"{getattr(blocks, 'dtype', type(blocks).__name__)} {getattr(blocks, 'shape', '')}")


def sha256_chain_array(parent: bytes, blocks: np.ndarray) -> np.ndarray | None:
    """Chained vLLM ``sha256`` block hashes of blocks without extra keys, as one array.

    Row ``i`` is ``sha256(pickle.dumps((h_{i-1}, tuple(blocks[i]), None), protocol=5))``
    with ``h_{-1} = parent`` (vLLM 0.33 ``hash_block_tokens``, docs/specs/hashing.md §1.4),
    the whole chain written and hashed in one kernel call (a block needing a second FRAME
    is pickled by ``pickle`` itself).

    Args:
        parent: the previous block's 32-byte hash, or NONE_HASH for the first block.
        blocks: ``uint64[num_blocks, block_size]`` token ids.

    Returns:
        ``uint8[num_blocks, 32]``; ``None`` when no SHA-256 engine is available
        (:func:`~kvlab.hashing.sha_ni.sha256_engine`: the caller hashes with ``hashlib``).

    Raises:
        ValueError: ``parent`` not 32 bytes, or ``blocks`` not a 2-D ``uint64`` array.

    Example:
        >>> root = hash_fn("sha256")("vllm-none-hash")
        >>> out = sha256_chain_array(root, np.array([[1, 2, 3, 4]], np.uint64))
        >>> out is None or out[0].tobytes().hex()[:16] == '52a7f141c60918f6'
        True
    """
    check_chain_input(parent, blocks)
    engine = sha256_engine()
    if engine is None:
        return None
    functions, hash_obj, blocks = engine_functions(engine), hash_fn("sha256"), np.ascontiguousarray(blocks)
    long_ints = True if blocks.size and int(blocks.max()) >= _LONG1_FROM else None
    out = np.empty((blocks.shape[0], 32), np.uint8)
    h, a = np.frombuffer(parent, np.uint8), 0
    while a < blocks.shape[0]:
        digests, done = _sha256_chain(blocks[a:], h, long_ints, functions)
        out[a:a + done] = digests[:done]
        a += done
        h = out[a - 1] if a else h
        if a < blocks.shape[0]:  # a pickle of two frames: let pickle write it
            out[a] = h = np.frombuffer(hash_obj((h.tobytes(), tuple(blocks[a].tolist()), None)), np.uint8)
            a += 1
    return out


def digest_list(digests: np.ndarray) -> list[bytes]:
    """The rows of ``uint8[n, w]`` as ``w``-byte ``bytes``: numpy's ``S<w>`` items (fast)
    drop trailing zero bytes, so rows ending in 0x00 get theirs back."""
    width = digests.shape[1]
    out = digests.view(f"S{width}").ravel().tolist()
    for i in np.flatnonzero(digests[:, -1] == 0).tolist():
        out[i] = out[i].ljust(width, b"\0")
    return out
