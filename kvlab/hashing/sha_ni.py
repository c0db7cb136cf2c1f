"""SHA-256 of chained block payloads inside numba kernels: x86 SHA extensions or libcrypto.

vLLM's ``sha256`` block hash is ``sha256(payload)`` where the payload (pickle or CBOR)
holds the parent block's 32-byte digest at a fixed offset (13 for pickle, 3 for CBOR) and
the block's tokens after it. The chain kernels write each payload, SHA-256-padded, into a
buffer and call :func:`sha256_spliced`, which hashes it with the parent taken from where
the previous call wrote its digest. Two engines, chosen by the *type* of the kernel's
``functions`` argument when numba compiles it:

* ``None``: the x86 SHA extensions (``sha_ni``: ``sha256rnds2``, ``sha256msg1/2``) through
  LLVM intrinsics, state in registers and the parent spliced into the first 64-byte
  chunk in registers (no store of the parent into the buffer, whose reload could not be
  store-forwarded). Compiled only when :func:`sha256_engine` says ``"sha_ni"``: the host
  CPU has the extensions, numba compiles for the host, and a kernel's digests of test
  messages equal ``hashlib``'s.
* a ``uint64[3]`` array of libcrypto addresses (:func:`~kvlab.hashing.libcrypto.sha256_functions`):
  the parent is copied into the buffer and ``SHA256_Init/Update/Final`` hash it.

Both give ``hashlib.sha256``'s digests; tests compare them byte for byte.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils, errors
from numba.extending import intrinsic, overload

from kvlab.core.jit import kernel_jit
from kvlab.hashing.libcrypto import load_u64, sha256_digest, sha256_functions, store_u64

#: SHA-256 round constants (FIPS 180-4 §4.2.2).
_K = (0x428A2F98, 0x71374491, 0xB5C0FBCF, 0xE9B5DBA5, 0x3956C25B, 0x59F111F1, 0x923F82A4, 0xAB1C5ED5,
      0xD807AA98, 0x12835B01, 0x243185BE, 0x550C7DC3, 0x72BE5D74, 0x80DEB1FE, 0x9BDC06A7, 0xC19BF174,
      0xE49B69C1, 0xEFBE4786, 0x0FC19DC6, 0x240CA1CC, 0x2DE92C6F, 0x4A7484AA, 0x5CB0A9DC, 0x76F988DA,
      0x983E5152, 0xA831C66D, 0xB00327C8, 0xBF597FC7, 0xC6E00BF3, 0xD5A79147, 0x06CA6351, 0x14292967,
      0x27B70A85, 0x2E1B2138, 0x4D2C6DFC, 0x53380D13, 0x650A7354, 0x766A0ABB, 0x81C2C92E, 0x92722C85,
      0xA2BFE8A1, 0xA81A664B, 0xC24B8B70, 0xC76C51A3, 0xD192E819, 0xD6990624, 0xF40E3585, 0x106AA070,
      0x19A4C116, 0x1E376C08, 0x2748774C, 0x34B0BCB5, 0x391C0CB3, 0x4ED8AA4A, 0x5B9CCA4F, 0x682E6FF3,
      0x748F82EE, 0x78A5636F, 0x84C87814, 0x8CC70208, 0x90BEFFFA, 0xA4506CEB, 0xBEF9A3F7, 0xC67178F2)
#: Initial hash value H(0) (FIPS 180-4 §5.3.3).
_IV = (0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19)
_I8, _I32, _I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
_V4, _V16B = ir.VectorType(_I32, 4), ir.VectorType(_I8, 16)
#: Byte order within each 32-bit word reversed (SHA-256 words are big-endian).
_BSWAP_WORDS = [4 * (i // 4) + 3 - i % 4 for i in range(16)]
_HOST_FEATURES = ("sha", "ssse3", "sse4.1")


@lru_cache(maxsize=1)
def _host_features() -> dict[str, bool]:
    from llvmlite import binding

    return dict(binding.get_host_cpu_features())


def host_has_sha_ni() -> bool:
    """Whether numba compiles for this CPU and it has the SHA extensions (plus SSSE3 and
    SSE4.1); without them the intrinsics cannot be compiled."""
    from numba.core import config

    features = _host_features()
    host_target = config.CPU_NAME in (None, "host") and (config.CPU_FEATURES is None or "+sha" in config.CPU_FEATURES)
    return host_target and all(features.get(name, False) for name in _HOST_FEATURES)


def _vec(values: list[int] | tuple[int, ...], ty: ir.IntType = _I32) -> ir.Constant:
    return ir.Constant(ir.VectorType(ty, len(values)), [ir.Constant(ty, v) for v in values])


def _shuffle(builder: ir.IRBuilder, a: ir.Value, b: ir.Value, mask: list[int]) -> ir.Value:
    return builder.shuffle_vector(a, b, _vec(mask))


def _x86(builder: ir.IRBuilder, name: str, num_args: int) -> ir.Function:
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V4, [_V4] * num_args), f"llvm.x86.{name}")


def _compress(builder: ir.IRBuilder, abef: ir.Value, cdgh: ir.Value,
              words: list[ir.Value]) -> tuple[ir.Value, ir.Value]:
    """The 64 rounds on one chunk (``words``: four ``<4 x i32>``, message words as lanes),
    state in SHA-NI's ABEF / CDGH lane order; returns the new state."""
    rnds2, msg1, msg2 = _x86(builder, "sha256rnds2", 3), _x86(builder, "sha256msg1", 2), _x86(builder, "sha256msg2", 2)
    w = list(words)
    s0, s1 = abef, cdgh
    for i in range(16):
        if i >= 4:  # W[4i..4i+3] from W[4i-16..4i-1]
            x = builder.call(msg1, [w[i - 4], w[i - 3]])
            x = builder.add(x, _shuffle(builder, w[i - 2], w[i - 1], [1, 2, 3, 4]))
            w.append(builder.call(msg2, [x, w[i - 1]]))
        m = builder.add(w[i], _vec(_K[4 * i:4 * i + 4]))
        s1 = builder.call(rnds2, [s1, s0, m])
        s0 = builder.call(rnds2, [s0, s1, _shuffle(builder, m, m, [2, 3, 2, 3])])
    return builder.add(s0, abef), builder.add(s1, cdgh)


def _load16(builder: ir.IRBuilder, address: ir.Value, offset: int = 0) -> ir.Value:
    at = builder.add(address, ir.Constant(_I64, offset))
    return builder.load(builder.inttoptr(at, _V16B.as_pointer()), align=1)


def _words(builder: ir.IRBuilder, data: ir.Value, parent: list[ir.Value] | None = None,
           offset: int = 0) -> list[ir.Value]:
    """The message words of the 64 bytes at ``data``, bytes ``[offset, offset + 32)``
    taken from ``parent`` (two ``<16 x i8>``) instead when given."""
    loaded = [_load16(builder, data, 16 * k) for k in range(4)]
    words = []
    for k in range(4):
        sources = []  # per byte: (None: the loaded chunk, 0/1: a parent half; index)
        for j in range(16):
            q = 16 * k + j - offset
            sources.append((q // 16, q % 16) if parent is not None and 0 <= q < 32 else (None, j))
        keys = list(dict.fromkeys(s for s, _ in sources))  # at most two sources per word
        vectors = [loaded[k] if key is None else parent[key] for key in keys]
        mask = [index + 16 * keys.index(source) for source, index in sources]
        word = _shuffle(builder, vectors[0], vectors[-1], [mask[i] for i in _BSWAP_WORDS])
        words.append(builder.bitcast(word, _V4))
    return words


def _spliced_codegen(offset: int):  # noqa: ANN202 - builds a numba codegen function
    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202, ARG001 - numba intrinsic
        data, num_chunks, parent, out = args[:4]
        # opaque to LLVM: it would otherwise fuse the two halves into a 256-bit load and
        # shuffle, leaving dirty upper register halves that stall the (legacy SSE) SHA ops
        opaque = ir.FunctionType(_V16B, [_V16B])
        halves = [builder.asm(opaque, "", "=x,0", [_load16(builder, parent, 16 * k)], side_effect=False)
                  for k in range(2)]
        words = _words(builder, data, halves, offset)
        if _host_features().get("avx", False):  # legacy SSE after dirty AVX upper halves is slow
            builder.call(cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                        "llvm.x86.avx.vzeroupper"), [])
        abef = _vec([_IV[5], _IV[4], _IV[1], _IV[0]])
        cdgh = _vec([_IV[7], _IV[6], _IV[3], _IV[2]])
        abef, cdgh = _compress(builder, abef, cdgh, words)
        state = [cgutils.alloca_once_value(builder, abef), cgutils.alloca_once_value(builder, cdgh)]
        with cgutils.for_range(builder, builder.sub(num_chunks, ir.Constant(_I64, 1))) as loop:
            at = builder.mul(builder.add(loop.index, ir.Constant(_I64, 1)), ir.Constant(_I64, 64))
            words = _words(builder, builder.add(data, at))
            new = _compress(builder, builder.load(state[0]), builder.load(state[1]), words)
            for slot, value in zip(state, new, strict=True):
                builder.store(value, slot)
        abef, cdgh = builder.load(state[0]), builder.load(state[1])
        for k, lanes in enumerate(([3, 2, 7, 6], [1, 0, 5, 4])):  # H0..H3, H4..H7
            half = builder.bitcast(_shuffle(builder, abef, cdgh, lanes), _V16B)
            at = builder.add(out, ir.Constant(_I64, 16 * k))
            digest = _shuffle(builder, half, half, _BSWAP_WORDS)
            builder.store(digest, builder.inttoptr(at, _V16B.as_pointer()), align=1)
        return context.get_dummy_value()

    return codegen


@intrinsic(prefer_literal=True)
def sha256_ni(typingctx, data, num_chunks, parent, out, offset):  # noqa: ANN001, ANN201, ARG001 - numba intrinsic
    """SHA-256 with the SHA extensions of the ``num_chunks`` padded 64-byte chunks at
    address ``data`` whose bytes ``[offset, offset + 32)`` are the 32 bytes at address
    ``parent`` (whatever the buffer holds there), into the 32 bytes at ``out``.
    ``offset`` must be a literal with ``offset + 32 <= 64``; addresses are ``uint64``."""
    if not isinstance(offset, types.IntegerLiteral):
        raise errors.RequireLiteralValue(offset)
    if not 0 <= offset.literal_value <= 32:
        raise errors.TypingError(f"sha256_ni: the parent must lie in the first chunk, offset {offset.literal_value}")
    if not host_has_sha_ni():
        raise errors.TypingError("sha256_ni: this CPU (or numba's target) has no SHA extensions")
    return types.void(types.uint64, types.int64, types.uint64, types.uint64, offset), \
        _spliced_codegen(offset.literal_value)


def sha256_spliced(functions, ctx, data, end, num_chunks, parent, out, offset):  # noqa: ANN001, ANN201, ARG001
    """SHA-256 of the ``end`` bytes at address ``data`` (padded to ``num_chunks`` chunks by
    :func:`pad_sha256`) whose bytes ``[offset, offset + 32)`` are the 32 bytes at
    ``parent``, into the 32 bytes at ``out`` (numba only). ``functions``: ``None`` for the
    SHA extensions, libcrypto's addresses otherwise (then ``ctx`` is the address of
    :data:`~kvlab.hashing.libcrypto.CTX_BYTES` scratch bytes and the parent is copied
    into the buffer). ``offset`` must be a literal."""
    raise NotImplementedError("sha256_spliced runs inside numba kernels only")


@overload(sha256_spliced, prefer_literal=True)
def _sha256_spliced(functions, ctx, data, end, num_chunks, parent, out, offset):  # noqa: ANN001, ANN202, ARG001
    if isinstance(functions, types.NoneType):
        def with_sha_ni(functions, ctx, data, end, num_chunks, parent, out, offset):  # noqa: ANN001, ANN202, ARG001
            sha256_ni(data, num_chunks, parent, out, offset)
        return with_sha_ni

    def with_libcrypto(functions, ctx, data, end, num_chunks, parent, out, offset):  # noqa: ANN001, ANN202, ARG001
        for k in range(4):
            store_u64(data + np.uint64(offset + 8 * k), load_u64(parent + np.uint64(8 * k)))
        sha256_digest(functions, ctx, data, end, out)
    return with_libcrypto


@kernel_jit(nogil=True)
def pad_sha256(base, end):  # noqa: ANN001, ANN201 - numba helper
    """SHA-256 padding after the ``end``-byte message at address ``base`` (``0x80``, zeros,
    the bit length big-endian), with 8-byte stores from ``base + end`` (the buffer needs
    room up to the padded end); returns the number of 64-byte chunks."""
    num_chunks = (end + 9 + 63) // 64
    store_u64(base + np.uint64(end), np.uint64(0x80))
    last = num_chunks * 64 - 8
    p = end + 8
    while p < last:
        store_u64(base + np.uint64(p), np.uint64(0))
        p += 8
    bits = np.uint64(end) * np.uint64(8)
    swapped = np.uint64(0)
    for k in range(8):
        swapped |= ((bits >> np.uint64(8 * k)) & np.uint64(0xFF)) << np.uint64(8 * (7 - k))
    store_u64(base + np.uint64(last), swapped)
    return num_chunks


@kernel_jit(nogil=True)
def _check_kernel(functions, messages, lengths, parents):  # noqa: ANN001, ANN202 - numba kernel
    """Digests (``uint8[n, 32]``) of each ``messages[i, :lengths[i]]`` with the 32 bytes at
    offset 13 replaced by ``parents[i]``, through :func:`sha256_spliced`."""
    buf = np.zeros(messages.shape[1] + 128, np.uint8)
    ctx = np.zeros(256, np.uint8)
    out = np.zeros((messages.shape[0], 32), np.uint8)
    base, c = np.uint64(buf.ctypes.data), np.uint64(ctx.ctypes.data)
    for i in range(messages.shape[0]):
        buf[:lengths[i]] = messages[i, :lengths[i]]
        num_chunks = pad_sha256(base, lengths[i])
        sha256_spliced(functions, c, base, lengths[i], num_chunks, np.uint64(parents[i:].ctypes.data),
                       np.uint64(out[i:].ctypes.data), 13)
    return out


def _self_check(functions: np.ndarray | None) -> bool:
    """Whether :func:`sha256_spliced` with ``functions`` gives ``hashlib``'s digests on
    messages of 45..300 bytes (one to five chunks, every padding boundary)."""
    rng = np.random.default_rng(2024)
    lengths = np.array([45, 55, 56, 63, 64, 119, 120, 128, 183, 300], np.int64)
    messages = rng.integers(0, 256, size=(len(lengths), 300), dtype=np.uint8)
    parents = rng.integers(0, 256, size=(len(lengths), 32), dtype=np.uint8)
    digests = _check_kernel(functions, messages, lengths, parents)
    for i, length in enumerate(lengths.tolist()):
        message = bytearray(messages[i, :length].tobytes())
        message[13:45] = parents[i].tobytes()
        if digests[i].tobytes() != hashlib.sha256(bytes(message)).digest():
            return False
    return True


@lru_cache(maxsize=1)
def sha256_engine() -> str | None:
    """How the chain kernels compute SHA-256 here: ``"sha_ni"`` (the CPU's SHA
    extensions), ``"libcrypto"`` (OpenSSL's functions), or ``None`` (neither: callers
    take their pure-Python path). Each is used only after its digests of test messages
    equal ``hashlib``'s (checked once per process)."""
    if host_has_sha_ni() and _self_check(None):
        return "sha_ni"
    functions = sha256_functions()
    if functions is not None and _self_check(functions):
        return "libcrypto"
    return None


def engine_functions(engine: str) -> np.ndarray | None:
    """The ``functions`` argument of the chain kernels for ``engine`` (see
    :func:`sha256_engine`): ``None`` for ``"sha_ni"``, libcrypto's addresses for
    ``"libcrypto"``.

    Raises:
        ValueError: another engine, or libcrypto unavailable.
    """
    if engine == "sha_ni":
        return None
    functions = sha256_functions() if engine == "libcrypto" else None
    if functions is None:
        raise ValueError(f"engine must be 'sha_ni' or an available 'libcrypto', got {engine!r}")
    return functions
