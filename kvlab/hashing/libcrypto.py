"""SHA-256 from OpenSSL's libcrypto inside numba kernels (the library Python's
``hashlib`` uses, so the same SHA extensions, e.g. x86 ``sha_ni``).

The kernels call ``SHA256_Init`` / ``SHA256_Update`` / ``SHA256_Final`` (the one-shot
``SHA256`` of OpenSSL 3 goes through ``EVP_Q_digest``, which looks the digest up on every
call: 6× slower on a 117-byte message). Their addresses are passed to the kernels as
integers (:func:`sha256_functions`) and called through :func:`sha256_digest`, so no raw
pointer is embedded in compiled code and the kernels stay cacheable on disk. When the
library or its functions cannot be found, or its digest of a test message differs from
``hashlib``'s, :func:`sha256_functions` returns ``None`` and callers take their
pure-Python path, which gives the same digests.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
from functools import lru_cache
from pathlib import Path

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from kvlab.core.jit import kernel_jit

_NAMES = ("SHA256_Init", "SHA256_Update", "SHA256_Final")
#: Bytes reserved for an OpenSSL ``SHA256_CTX`` (112 bytes in OpenSSL 1.1 and 3.x).
CTX_BYTES = 256


def _hashlib_libcrypto() -> str | None:
    """Path of the libcrypto ``_hashlib`` is linked against, from this process's maps
    (Linux); ``None`` elsewhere or when not found."""
    import _hashlib  # noqa: F401 - loads libcrypto into this process

    maps = Path("/proc/self/maps")
    if not maps.exists():
        return None
    for line in maps.read_text().splitlines():
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        if "libcrypto" in Path(path).name:
            return path
    return None


@lru_cache(maxsize=1)
def sha256_functions() -> np.ndarray | None:
    """Addresses of libcrypto's ``SHA256_Init``, ``SHA256_Update`` and ``SHA256_Final``
    (``uint64[3]``), or ``None`` when unavailable or wrong (see the module docstring).

    The library is the one ``hashlib``'s ``_hashlib`` links against, else
    ``ctypes.util.find_library("crypto")``. Checked once per process: the digest of a
    test message through these functions must equal ``hashlib.sha256``'s.
    """
    for path in dict.fromkeys(p for p in (_safe(_hashlib_libcrypto), _safe(lambda: ctypes.util.find_library("crypto")))
                              if p):
        try:
            lib = ctypes.CDLL(path)
            addresses = np.array([ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in _NAMES],
                                 dtype=np.uint64)
        except (OSError, AttributeError):
            continue
        message = b"kvlab libcrypto check " * 7
        if _ctypes_digest(lib, message) == hashlib.sha256(message).digest():
            return addresses
    return None


def _ctypes_digest(lib: ctypes.CDLL, message: bytes) -> bytes:
    """SHA-256 of ``message`` through the functions named :data:`_NAMES` in ``lib``, called
    by ctypes (the check needs no compiled kernel)."""
    init, update, final = (getattr(lib, name) for name in _NAMES)
    ctx, out = ctypes.create_string_buffer(CTX_BYTES), ctypes.create_string_buffer(32)
    init(ctx)
    update(ctx, message, ctypes.c_size_t(len(message)))
    final(out, ctx)
    return out.raw


def _safe(find) -> str | None:  # noqa: ANN001 - a path finder that may fail
    try:
        return find()
    except (ImportError, OSError):
        return None


def _codegen(context, builder, signature, llvm_args):  # noqa: ANN001, ANN202, ARG001 - numba intrinsic
    """Call the C function ``int f(uint64, ...)`` at address ``llvm_args[0]``."""
    i64 = ir.IntType(64)
    fnty = ir.FunctionType(ir.IntType(32), [i64] * (len(llvm_args) - 1))
    return builder.call(builder.inttoptr(llvm_args[0], fnty.as_pointer()), list(llvm_args[1:]))


@intrinsic
def _call1(typingctx, address, a):  # noqa: ANN001, ANN202, ARG001 - numba intrinsic
    return types.int32(types.uint64, types.uint64), _codegen


@intrinsic
def _call2(typingctx, address, a, b):  # noqa: ANN001, ANN202, ARG001 - numba intrinsic
    return types.int32(types.uint64, types.uint64, types.uint64), _codegen


@intrinsic
def _call3(typingctx, address, a, b, c):  # noqa: ANN001, ANN202, ARG001 - numba intrinsic
    return types.int32(types.uint64, types.uint64, types.uint64, types.uint64), _codegen


def _store_codegen(context, builder, signature, llvm_args):  # noqa: ANN001, ANN202, ARG001 - numba intrinsic
    address, value = llvm_args
    builder.store(value, builder.inttoptr(address, ir.IntType(64).as_pointer()), align=1)
    return context.get_dummy_value()


def _load_codegen(context, builder, signature, llvm_args):  # noqa: ANN001, ANN202, ARG001 - numba intrinsic
    return builder.load(builder.inttoptr(llvm_args[0], ir.IntType(64).as_pointer()), align=1)


@intrinsic
def store_u64(typingctx, address, value):  # noqa: ANN001, ANN201, ARG001 - numba intrinsic
    """``*(uint64 *)address = value`` (little-endian, any alignment): one store where a
    kernel would write 8 bytes one by one. The caller keeps ``address`` inside its buffer."""
    return types.void(types.uint64, types.uint64), _store_codegen


@intrinsic
def load_u64(typingctx, address):  # noqa: ANN001, ANN201, ARG001 - numba intrinsic
    """``*(uint64 *)address`` (any alignment), the counterpart of :func:`store_u64`."""
    return types.uint64(types.uint64), _load_codegen


@kernel_jit(nogil=True)
def sha256_digest(functions, ctx, data, length, out):  # noqa: ANN001, ANN201 - numba helper
    """SHA-256 of the ``length`` bytes at address ``data`` into the 32 bytes at address
    ``out`` through libcrypto; ``functions`` from :func:`sha256_functions`, ``ctx`` the
    address of ``CTX_BYTES`` scratch bytes (all addresses ``uint64``, e.g.
    ``np.uint64(array.ctypes.data)``)."""
    _call1(functions[0], ctx)
    _call3(functions[1], ctx, data, np.uint64(length))
    _call2(functions[2], out, ctx)
