"""Numba kernels of CacheBlend chunk matching: polynomial rolling hashes and a direct-address table.

Models LMCache ``lmcache/v1/multiprocess/token_hasher.py`` (docs/specs/index_blend.md Part D.2,
rules B5-B8). A chunk of ``k`` tokens ``x_0 .. x_(k-1)`` gets the polynomial fingerprint::

    H = x_0 * base**(k-1) + x_1 * base**(k-2) + ... + x_(k-1)      (mod 2**64)

computed in ``uint64`` with wrap-around: every multiply and add is the machine's unsigned
64-bit arithmetic, so the result equals the Python expression above reduced ``% 2**64``
(the tests check this against plain Python ints). Tokens are read as ``uint64`` (``uint32``
ids as they are; an ``int64`` value ``v < 0`` would read as ``v + 2**64``, which is why
:class:`~kvlab.blend.matcher.TokenRangeMatcher` refuses negative ids before hashing).

- :func:`rolling_hashes` (B5): every window, stride 1, O(1) per step; ``uint64[n - k + 1]``.
- :func:`chunk_hashes` (B6): non-overlapping chunks, stride ``k``, each from scratch; the
  trailing partial chunk is ignored; ``uint64[n // k]``. Window ``j * k`` of B5 equals chunk
  ``j`` of B6, which is what makes a stored chunk findable at any query offset.
- :func:`write_table` (B7): ``table[hash & (size - 1)] = id``, last write wins.
- :func:`unique_hits` (B8): the ids the hashes' slots hold (``-1`` = empty), each once, in
  first-encounter order.

The hash is linear in the tokens, so different chunks can share a fingerprint (raise token
``i`` by 1 and lower token ``i + 1`` by ``base``): a fingerprint alone never proves equal
content, and the matcher confirms every candidate by comparing tokens.
"""

from __future__ import annotations

import numpy as np

from kvlab.core.jit import kernel_jit
from kvlab.core.validate import check_int, check_u64

#: LMCache's matcher base: the 64-bit Fibonacci hashing constant (B9).
BLEND_BASE = 0x9E3779B97F4A7C15
#: An empty table slot.
EMPTY = -1
#: Largest window / chunk length ``k`` the kernels (and ``TokenRangeMatcher.chunk_size``) accept, tokens.
MAX_CHUNK_TOKENS = 1 << 24
#: Largest ``num_ids`` of :func:`unique_hits` (ids ``< 2**31`` fit an ``int32`` table; the seen-bitmap is bytes).
MAX_NUM_IDS = 1 << 31

_U64_MAX = (1 << 64) - 1


@kernel_jit(nogil=True)
def _rolling(tokens, k, base):  # noqa: ANN001, ANN202 - numba kernel (B5); k <= len(tokens)
    num_windows = tokens.shape[0] - k + 1
    out = np.empty(num_windows, dtype=np.uint64)
    top = np.uint64(1)  # base ** (k - 1), the weight of the outgoing token
    for _ in range(k - 1):
        top *= base
    h = np.uint64(0)
    for i in range(k):
        h = h * base + np.uint64(tokens[i])
    out[0] = h
    for i in range(1, num_windows):
        h = (h - np.uint64(tokens[i - 1]) * top) * base + np.uint64(tokens[i + k - 1])
        out[i] = h
    return out


@kernel_jit(nogil=True)
def _chunks(tokens, k, base):  # noqa: ANN001, ANN202 - numba kernel (B6)
    num_chunks = tokens.shape[0] // k
    out = np.empty(num_chunks, dtype=np.uint64)
    for j in range(num_chunks):
        h = np.uint64(0)
        for i in range(j * k, (j + 1) * k):
            h = h * base + np.uint64(tokens[i])
        out[j] = h
    return out


@kernel_jit(nogil=True)
def _write(hashes, table, ids):  # noqa: ANN001, ANN202 - numba kernel (B7)
    mask = np.uint64(table.shape[0] - 1)
    for i in range(hashes.shape[0]):
        table[hashes[i] & mask] = ids[i]


@kernel_jit(nogil=True)
def _unique(hashes, table, num_ids):  # noqa: ANN001, ANN202 - numba kernel (B8); returns (ids, first bad id or -1)
    mask = np.uint64(table.shape[0] - 1)
    seen = np.zeros(num_ids, dtype=np.uint8)
    out = np.empty(min(hashes.shape[0], num_ids), dtype=np.int64)
    n = 0
    for i in range(hashes.shape[0]):
        cid = np.int64(table[hashes[i] & mask])
        if cid == EMPTY:
            continue
        if cid < 0 or cid >= num_ids:
            return out[:n], cid
        if seen[cid] == 0:
            seen[cid] = 1
            out[n] = cid
            n += 1
    return out[:n], np.int64(EMPTY)


def _token_array(tokens: np.ndarray) -> np.ndarray:
    """``tokens`` as a 1-D ``uint32`` or ``uint64`` array for the kernels (other integer dtypes wrap to uint64)."""
    arr = np.asarray(tokens)
    if arr.ndim != 1 or (arr.size and (arr.dtype.kind not in "iu")):
        raise ValueError(f"tokens must be a 1-D integer array, got shape {arr.shape} dtype {arr.dtype}")
    return arr if arr.dtype in (np.uint32, np.uint64) else arr.astype(np.uint64)


def _check_k_base(k: int, base: int) -> np.uint64:
    check_int("k", k, low=1, high=MAX_CHUNK_TOKENS)
    return np.uint64(check_u64("base", base))


def rolling_hashes(tokens: np.ndarray, k: int, base: int = BLEND_BASE) -> np.ndarray:
    """Polynomial fingerprint of every length-``k`` window, stride 1 (B5).

    Args:
        tokens: ``uint32[n]`` or ``int64[n]`` token ids (any 1-D integer array).
        k: window length in tokens (``1 .. MAX_CHUNK_TOKENS``).
        base: the polynomial base, an integer in ``[0, 2**64)``. Any value is hashed as given,
            degenerate ones too (0: the last token; 1: the token sum), which tests use to force
            collisions; :class:`~kvlab.blend.matcher.TokenRangeMatcher` requires ``base >= 2``.

    Returns:
        ``uint64[n - k + 1]`` (empty when ``n < k``): entry ``i`` hashes ``tokens[i : i + k]``,
        with uint64 wrap-around (see the module docstring).

    Raises:
        ValueError: ``k`` outside ``[1, MAX_CHUNK_TOKENS]``, ``base`` out of range, or ``tokens`` not a
            1-D integer array.

    Example:
        >>> rolling_hashes(np.array([1, 2, 3, 4, 5]), 3, base=31).tolist()
        [1026, 2019, 3012]
    """
    ubase = _check_k_base(k, base)
    arr = _token_array(tokens)
    if arr.shape[0] < k:
        return np.zeros(0, dtype=np.uint64)
    return _rolling(arr, int(k), ubase)


def chunk_hashes(tokens: np.ndarray, k: int, base: int = BLEND_BASE) -> np.ndarray:
    """Polynomial fingerprint of each non-overlapping length-``k`` chunk (B6).

    Args:
        tokens: ``uint32[n]`` or ``int64[n]`` token ids.
        k: chunk length in tokens (``1 .. MAX_CHUNK_TOKENS``).
        base: the polynomial base, an integer in ``[0, 2**64)`` (0 and 1 allowed, as :func:`rolling_hashes`).

    Returns:
        ``uint64[n // k]``: entry ``j`` hashes ``tokens[j*k : (j+1)*k]`` (equal to
        ``rolling_hashes(tokens, k, base)[j * k]``); a trailing partial chunk is ignored.

    Raises:
        ValueError: as :func:`rolling_hashes`.

    Example:
        >>> chunk_hashes(np.array([1, 2, 3, 4, 5, 6]), 3, base=31).tolist()
        [1026, 4005]
    """
    ubase = _check_k_base(k, base)
    return _chunks(_token_array(tokens), int(k), ubase)


def _check_table(table: np.ndarray, *, writable: bool) -> None:
    size = table.shape[0] if isinstance(table, np.ndarray) and table.ndim == 1 else 0
    if size == 0 or size & (size - 1) or table.dtype not in (np.int32, np.int64):
        shape, dtype = getattr(table, "shape", None), getattr(table, "dtype", None)
        raise ValueError("table must be a 1-D int32/int64 array whose size is a power of two, got "
                         f"{type(table).__name__} shape {shape} dtype {dtype}")
    if writable and not table.flags.writeable:
        raise ValueError("table must be writable (write_table fills it in place), got a read-only array")


def _exact_ints(field: str, values: object, high: int, dtype: type) -> np.ndarray:
    """``values`` as a 1-D ``dtype`` array if every item is an integer in ``[0, high]``;
    else ValueError naming ``field``.

    Only exact conversions: no float (truncated), bool or negative (wrapped) value passes.
    """
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{field} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=dtype)
    if arr.dtype == object:  # Python ints beyond int64/uint64 together
        for i, v in enumerate(arr.tolist()):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v <= high:
                raise ValueError(f"{field} must hold integers in [0, {high}], got {v!r} at position {i}")
        return arr.astype(dtype)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{field} must be a non-negative integer array (uint64 for hashes), got dtype {arr.dtype}")
    low_v, high_v = int(arr.min()), int(arr.max())
    if low_v < 0 or high_v > high:
        bad = low_v if low_v < 0 else high_v
        raise ValueError(f"{field} must hold integers in [0, {high}], got {bad} at position "
                         f"{int(np.argmax(arr == bad))}")
    return arr.astype(dtype, copy=False)


def write_table(hashes: np.ndarray, table: np.ndarray, ids: np.ndarray) -> None:
    """Direct-address write ``table[hashes[i] & (len(table) - 1)] = ids[i]``, in order (B7).

    Models LMCache ``update_table_id_numba``: on a slot collision the last write wins (the
    upstream limitation B21 that :class:`~kvlab.blend.matcher.TokenRangeMatcher` fixes with chains).

    Args:
        hashes: ``uint64[m]`` fingerprints (or a 1-D integer array / list of values in ``[0, 2**64)``,
            converted exactly).
        table: writable ``int32[size]`` or ``int64[size]``, ``size`` a power of two; written in place.
        ids: ``int[m]`` ids to store, each in ``[0, max of the table's dtype]`` (an id that would
            wrap, e.g. ``2**32 - 1`` into ``int32`` as ``-1`` = empty, is refused).

    Raises:
        ValueError: table not a writable power-of-two 1-D int32/int64 array, ``hashes``/``ids`` not
            1-D, not integers or out of range, or ``len(hashes) != len(ids)``; the table is untouched then.

    Example:
        >>> table = np.full(8, -1, dtype=np.int64)
        >>> write_table(np.array([9], dtype=np.uint64), table, np.array([42]))
        >>> table.tolist()
        [-1, 42, -1, -1, -1, -1, -1, -1]
    """
    _check_table(table, writable=True)
    hashes = _exact_ints("hashes", hashes, _U64_MAX, np.uint64)
    ids = _exact_ints("ids", ids, int(np.iinfo(table.dtype).max), table.dtype)
    if hashes.shape != ids.shape:
        raise ValueError(f"hashes and ids must be 1-D of equal length, got {hashes.shape} and {ids.shape}")
    _write(hashes, table, ids)


def unique_hits(hashes: np.ndarray, table: np.ndarray, num_ids: int) -> np.ndarray:
    """The ids held by the hashes' slots, each once, in first-encounter order (B8).

    Models LMCache ``unique_hits_direct_id_numba`` (the older matcher's probe, B13: no
    fingerprint check, so a slot collision is a false hit there).

    Args:
        hashes: ``uint64[n]`` probe fingerprints (converted exactly, as :func:`write_table`).
        table: ``int32[size]``/``int64[size]`` of ids (``-1`` empty), ``size`` a power of two (may be read-only).
        num_ids: ids are in ``[0, num_ids)``, ``0 <= num_ids <= MAX_NUM_IDS`` (the seen-bitmap holds
            ``num_ids`` bytes).

    Returns:
        ``int64[h]`` distinct ids in the order their first hash was read.

    Raises:
        ValueError: bad table or hashes, ``num_ids`` outside ``[0, MAX_NUM_IDS]``, or a probed slot
            holding an id outside ``[-1, num_ids)``.

    Example:
        >>> table = np.array([2, 0, 1, -1], dtype=np.int64)
        >>> unique_hits(np.array([0, 1, 2, 4, 3], dtype=np.uint64), table, 3).tolist()
        [2, 0, 1]
    """
    _check_table(table, writable=False)
    num_ids = check_int("num_ids", num_ids, low=0, high=MAX_NUM_IDS)
    out, bad = _unique(_exact_ints("hashes", hashes, _U64_MAX, np.uint64), table, num_ids)
    if bad != EMPTY:
        raise ValueError(f"table holds id {int(bad)} outside [-1, num_ids={num_ids})")
    return out
