"""CPython's builtin ``hash()``, reimplemented: what LMCache computes when it falls back to it.

LMCache 0.5.6 hashes chunks with Python's ``hash()`` when vLLM is not importable (every
algorithm) and for ``pre_caching_hash_algorithm="builtin"`` (docs/specs/hashing.md §4.1).
kvlab never calls ``hash()`` in its logic (its value depends on the process), so this
module computes CPython's value from the algorithm (64-bit builds, CPython 3.11+):

* ``int``: ``x mod (2**61 - 1)`` with the sign of ``x``; ``-1`` becomes ``-2``
  (``Objects/longobject.c``). Deterministic everywhere.
* ``tuple``: the xxHash-derived ``tuplehash`` of the items' hashes (``Objects/tupleobject.c``,
  CPython 3.8+). Deterministic when its items' hashes are.
* ``None``: ``0xFCA86420`` on CPython 3.12+ (``Objects/object.c: none_hash``); on 3.11 and
  earlier it is the None object's address, which changes per process: pass that
  process's value as ``none_hash``.
* ``str`` / ``bytes``: SipHash-1-3 (CPython 3.11+; 3.10 used SipHash-2-4) over the
  string's internal buffer (1, 2 or 4 bytes per character, little-endian), keyed by
  the per-process hash secret: random unless ``PYTHONHASHSEED`` is set; a set
  ``PYTHONHASHSEED=N`` makes the key a fixed function of ``N``
  (:func:`hash_secret_from_pythonhashseed`), and ``N = 0`` a zero key.
"""

from __future__ import annotations

from kvlab.core.validate import check_int

#: The modulus of CPython's numeric hash on 64-bit builds (``_PyHASH_MODULUS``).
HASH_MODULUS = (1 << 61) - 1
#: ``hash(None)`` on CPython 3.12 and later (a constant since gh-99540).
NONE_HASH_CPYTHON_312 = 0xFCA86420
#: Largest value CPython accepts for ``PYTHONHASHSEED``.
MAX_PYTHONHASHSEED = (1 << 32) - 1
_M64 = (1 << 64) - 1
_XXPRIME_1 = 11400714785074694791
_XXPRIME_2 = 14029467366897019727
_XXPRIME_5 = 2870177450012600261


def _signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


def hash_secret_from_pythonhashseed(seed: int) -> tuple[int, int]:
    """The SipHash key ``(k0, k1)`` CPython derives from ``PYTHONHASHSEED=seed``.

    ``Python/bootstrap_hash.c``: seed 0 disables randomisation (zero key); another seed
    fills the 24-byte secret with ``lcg_urandom`` (``x = x * 214013 + 2531011`` mod
    2**32, one byte ``(x >> 16) & 0xff`` per step); ``k0``, ``k1`` are its first two
    little-endian 64-bit words.

    Raises:
        ValueError: ``seed`` not an integer in ``[0, 2**32)``.

    Example:
        >>> hash_secret_from_pythonhashseed(0)
        (0, 0)
    """
    seed = check_int("seed", seed, low=0, high=MAX_PYTHONHASHSEED)
    if seed == 0:
        return 0, 0
    x, secret = seed, bytearray()
    for _ in range(16):
        x = (x * 214013 + 2531011) & 0xFFFFFFFF
        secret.append((x >> 16) & 0xFF)
    return int.from_bytes(secret[:8], "little"), int.from_bytes(secret[8:], "little")


def _rotl(x: int, bits: int) -> int:
    return ((x << bits) | (x >> (64 - bits))) & _M64


def _sipround(v0: int, v1: int, v2: int, v3: int) -> tuple[int, int, int, int]:
    v0 = (v0 + v1) & _M64
    v1 = _rotl(v1, 13) ^ v0
    v0 = _rotl(v0, 32)
    v2 = (v2 + v3) & _M64
    v3 = _rotl(v3, 16) ^ v2
    v0 = (v0 + v3) & _M64
    v3 = _rotl(v3, 21) ^ v0
    v2 = (v2 + v1) & _M64
    v1 = _rotl(v1, 17) ^ v2
    v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


def siphash13(k0: int, k1: int, data: bytes) -> int:
    """SipHash-1-3 of ``data`` under the key ``(k0, k1)``, as CPython's ``Python/pyhash.c``
    computes it: one compression round per 8-byte word, three finalisation rounds.

    Returns:
        The unsigned 64-bit hash.

    Example:
        >>> siphash13(0, 0, b"0")  # CPython with PYTHONHASHSEED=0: hash("0")
        5313149338359954478
    """
    v0, v1 = k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D
    v2, v3 = k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573
    tail = len(data) % 8
    for start in range(0, len(data) - tail, 8):
        word = int.from_bytes(data[start:start + 8], "little")
        v3 ^= word
        v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
        v0 ^= word
    last = ((len(data) & 0xFF) << 56) | int.from_bytes(data[len(data) - tail:], "little")
    v3 ^= last
    v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
    v0 ^= last
    v2 ^= 0xFF
    for _ in range(3):
        v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
    return v0 ^ v1 ^ v2 ^ v3


def _str_buffer(text: str) -> bytes:
    """A str's PEP 393 buffer: latin-1, UCS-2 or UCS-4 by its widest character, little-endian."""
    widest = max(map(ord, text), default=0)
    if widest < 0x100:
        return text.encode("latin-1")
    return text.encode("utf-16-le", "surrogatepass") if widest < 0x10000 else text.encode("utf-32-le")


def python_hash(value: object, *, hash_secret: tuple[int, int] | None = None,
                none_hash: int = NONE_HASH_CPYTHON_312) -> int:
    """CPython's ``hash(value)`` for ints, ``None``, str, bytes and tuples of them (nested).

    Args:
        value: the object (bools hash as ints, as in CPython).
        hash_secret: the process's SipHash key, needed only when a str or bytes is
            hashed (:func:`hash_secret_from_pythonhashseed`).
        none_hash: ``hash(None)`` in the modelled process (the 3.12+ constant by default).

    Returns:
        The signed 64-bit hash, never ``-1``.

    Raises:
        ValueError: a type this model does not cover, or a str / bytes without
            ``hash_secret`` (their hash is salted per process).

    Example:
        >>> python_hash((1, (2, 3), ())), python_hash(-1), python_hash(2**61)
        (190248630909402296, -2, 1)
    """
    if isinstance(value, int):
        magnitude = abs(value) % HASH_MODULUS
        h = -magnitude if value < 0 else magnitude
        return -2 if h == -1 else h
    if value is None:
        return none_hash
    if isinstance(value, tuple):
        acc = _XXPRIME_5
        for item in value:
            lane = python_hash(item, hash_secret=hash_secret, none_hash=none_hash) & _M64
            acc = (acc + lane * _XXPRIME_2) & _M64
            acc = (_rotl(acc, 31) * _XXPRIME_1) & _M64
        acc = (acc + (len(value) ^ (_XXPRIME_5 ^ 3527539))) & _M64
        return 1546275796 if acc == _M64 else _signed(acc)
    if isinstance(value, (str, bytes)):
        if hash_secret is None:
            raise ValueError(f"hash of {type(value).__name__} {value!r} depends on the process's hash secret "
                             "(PYTHONHASHSEED): pass hash_secret")
        data = value if isinstance(value, bytes) else _str_buffer(value)
        if not data:
            return 0
        h = _signed(siphash13(hash_secret[0], hash_secret[1], data))
        return -2 if h == -1 else h
    raise ValueError(f"python_hash models int, None, str, bytes and tuples of them, got {type(value).__name__}")
