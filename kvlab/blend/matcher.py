"""CacheBlend non-prefix chunk matching: :class:`TokenRangeMatcher` finds stored chunks anywhere in a query.

Models LMCache's ``BlendTokenRangeMatcher`` (docs/specs/index_blend.md D.3, rules B9-B15,
B19): chunks of ``chunk_size`` raw token ids are registered with the storage key of their KV
and their stored position; a query is fingerprinted at every position with a polynomial
rolling hash (:mod:`kvlab.blend.kernels`) and each window's slot is probed. The table
behind it (:mod:`kvlab.blend.table`) fixes the upstream limits of B21:

- every candidate is confirmed against the stored full fingerprint and then by comparing
  the tokens (the hash is linear, so different chunks can share it: no KV is reused on a
  hash alone);
- slot collisions never overwrite (open addressing), and the slots double before more than
  a quarter is taken;
- ``remove`` unlinks exactly the removed chunk (B14 fixed), and compact ids are reused
  (B11 fixed: no overflow after any number of registrations over time);
- the same content stored twice keeps both copies (B15) unless ``dedup_content``.

Choices kvlab makes where upstream does not say: when two stored copies of a content are
equally near the query position, the one stored earlier (smaller ``old_st``) wins, then the
smaller storage key, so the result never depends on registration order. ``match(...,
align_tokens=b)`` is the strided probe of B19: only positions that are multiples of ``b``
are probed, so each chunk is reported at its first block-aligned occurrence.
Not thread-safe: one matcher per thread, or a caller's lock.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

import numpy as np

from kvlab.blend.kernels import BLEND_BASE, MAX_CHUNK_TOKENS, _chunks
from kvlab.blend.table import (
    ISSUED_IDS,
    LIVE_CONTENTS,
    make_table,
    probe,
    rebuild_slots,
    register_chunks,
    remove_ids,
    reserve,
)
from kvlab.core.validate import check_flag, check_int

_U32_MAX = (1 << 32) - 1
_U64_MAX = (1 << 64) - 1
#: Allowed ``table_bits`` (initial slots = 2**table_bits; upstream fixes 20, B9).
TABLE_BITS_RANGE = (3, 30)
#: Largest ``align_tokens`` of :meth:`TokenRangeMatcher.match` (engine block sizes are far smaller).
MAX_ALIGN_TOKENS = (1 << 31) - 1
#: Stored positions are int64: ``position_offset + num_chunks * chunk_size`` (the last ``old_ed``) must not exceed this.
MAX_POSITION = (1 << 63) - 1
_LIST_HINT = "pass a list or 1-D integer array"


class BlendMatch(NamedTuple):
    """One stored chunk found in a query (LMCache ``CBMatchResult``): token positions, ``ed = st + chunk_size``.

    ``old_st``/``old_ed``: where the chunk was registered; ``cur_st``/``cur_ed``: where it
    occurs in the query; ``storage_key``: the key its KV is stored under (the registered u64).

    Example:
        >>> m = BlendMatch(old_st=256, old_ed=512, cur_st=768, cur_ed=1024, storage_key=402)
        >>> m.cur_st - m.old_st  # a shifted hit: its KV needs positional re-encoding (B19)
        512
    """

    old_st: int
    old_ed: int
    cur_st: int
    cur_ed: int
    storage_key: int


def _python_ints(field: str, values: Sequence[object], high: int) -> np.ndarray:
    """A list whose numpy conversion was not integer: the first bad item named, else ``uint64``."""
    values = list(values)
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v <= high:
            raise ValueError(f"{field} must hold integers in [0, {high + 1}) ({_LIST_HINT}), got {v!r} at "
                             f"position {i}")
    return np.array(values, dtype=np.uint64)


def _as_ints(field: str, values: Sequence[int] | np.ndarray, high: int, dtype: type) -> np.ndarray:
    """``values`` as a 1-D ``dtype`` array, every item an integer in ``[0, high]``, else ValueError naming ``field``."""
    if isinstance(values, (str, bytes, Iterator)):
        raise ValueError(f"{field} must be a sequence of integers ({_LIST_HINT}), got {type(values).__name__}")
    arr = np.asarray(values)
    if arr.dtype == dtype and arr.ndim == 1 and high == np.iinfo(dtype).max:
        return np.ascontiguousarray(arr)  # every value of the dtype is in range: no scan (no copy if contiguous)
    if arr.dtype.kind in "fOUSb" and not isinstance(values, np.ndarray) and arr.ndim == 1:
        arr = _python_ints(field, values, high)
    if arr.ndim != 1:
        raise ValueError(f"{field} must be one-dimensional ({_LIST_HINT}), got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=dtype)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{field} must be integers ({_LIST_HINT}), got dtype {arr.dtype}")
    low_v, high_v = arr.min(), arr.max()
    if low_v < 0 or high_v > high:
        bad = low_v if low_v < 0 else high_v
        raise ValueError(f"{field} must be integers in [0, {high + 1}), got {int(bad)} at position "
                         f"{int(np.argmax(arr == bad))}")
    return arr.astype(dtype)


class TokenRangeMatcher:
    """Registered chunks of raw token ids, found at any offset of a query (B9-B15, B19; B11/B14/B21 fixed).

    Args:
        chunk_size: tokens per chunk (``1 .. MAX_CHUNK_TOKENS`` = 2**24; LMCache uses 256).
        base: polynomial base of the fingerprints, an integer in ``[2, 2**64)`` (default the
            Fibonacci hashing constant, B9). Bases 0 and 1 are refused: every chunk ending in the
            same token (base 0) or with the same token sum (base 1) would share a fingerprint, so
            registration and probing would compare tokens along ever longer runs (quadratic).
        table_bits: the slot array starts with ``2**table_bits`` slots (3..30; it doubles
            before more than a quarter is taken).
        dedup_content: index a content once: a chunk whose tokens are already live is not
            indexed (B10, B15), until every copy of that content is removed.

    Raises:
        ValueError: a parameter out of range, naming it.

    Example:
        >>> m = TokenRangeMatcher(chunk_size=4)
        >>> m.register([1, 2, 3, 4, 5, 6, 7, 8], [0xA, 0xB])
        2
        >>> m.match([100, 200, 300, 5, 6, 7, 8, 400])
        [BlendMatch(old_st=4, old_ed=8, cur_st=3, cur_ed=7, storage_key=11)]
        >>> m.remove([0xB]), len(m), m.match([5, 6, 7, 8])
        (1, 1, [])
    """

    def __init__(self, chunk_size: int = 256, *, base: int = BLEND_BASE, table_bits: int = 20,
                 dedup_content: bool = False) -> None:
        self._k = check_int("chunk_size", chunk_size, low=1, high=MAX_CHUNK_TOKENS)
        self._base = np.uint64(check_int("base", base, low=2, high=_U64_MAX))
        bits = check_int("table_bits", table_bits, low=TABLE_BITS_RANGE[0], high=TABLE_BITS_RANGE[1])
        self._dedup = check_flag("dedup_content", dedup_content)
        self._table = make_table(self._k, bits)
        self._ids: dict[int, int] = {}  # storage key -> copy id

    @property
    def chunk_size(self) -> int:
        """Tokens per chunk."""
        return self._k

    @property
    def table_slots(self) -> int:
        """Current number of slots (a power of two; doubles before distinct live chunks would take over a quarter)."""
        return int(self._table.slot_entry.shape[0])

    @property
    def distinct_chunks(self) -> int:
        """Live distinct chunk contents (copies of the same tokens count once)."""
        return int(self._table.counts[LIVE_CONTENTS])

    @property
    def issued_ids(self) -> int:
        """Compact ids ever issued: the peak of live chunks, since freed ids are reused (B11 fixed)."""
        return int(self._table.counts[ISSUED_IDS])

    def __len__(self) -> int:
        """Live registered chunks (copies included)."""
        return len(self._ids)

    def __contains__(self, storage_key: object) -> bool:
        """Whether a chunk with this storage key is registered."""
        return storage_key in self._ids

    def register(self, token_ids: Sequence[int] | np.ndarray, storage_keys: Sequence[int] | np.ndarray, *,
                 start_chunk: int = 0, position_offset: int = 0) -> int:
        """Index the full chunks of ``token_ids`` from ``start_chunk`` on (B10).

        Chunk ``j`` (tokens ``[j*k, (j+1)*k)``) is stored at position ``position_offset +
        j*k`` under ``storage_keys[j]``. A key already registered (or repeated in this call)
        is skipped (idempotent re-store); with ``dedup_content`` so is a chunk whose tokens
        are already live. The trailing partial chunk is ignored.

        Args:
            token_ids: ``uint32``-range token ids (list or 1-D integer array; not a string or generator).
            storage_keys: one u64 key per FULL chunk of ``token_ids`` (``len(token_ids) // chunk_size``).
            start_chunk: first chunk to index (``0 <= start_chunk <= num_chunks``; 1 when the
                prefix path already owns chunk 0).
            position_offset: position of ``token_ids[0]`` in the stored sequence, tokens (>= 0, and
                ``position_offset + num_chunks * chunk_size <= MAX_POSITION`` = 2**63 - 1: positions are int64).

        Returns:
            The number of chunks newly indexed.

        Raises:
            ValueError: tokens not integers in ``[0, 2**32)``, keys not in ``[0, 2**64)``, a key
                count that is not the number of full chunks, or ``start_chunk``/``position_offset``
                out of range; nothing is indexed then.
        """
        tokens = _as_ints("token_ids", token_ids, _U32_MAX, np.uint32)
        num_chunks = tokens.shape[0] // self._k
        keys = _as_ints("storage_keys", storage_keys, _U64_MAX, np.uint64)
        if keys.shape[0] != num_chunks:
            raise ValueError(f"storage_keys must hold one key per full chunk ({num_chunks} chunks of {self._k} tokens "
                             f"in {tokens.shape[0]} token_ids), got {keys.shape[0]}")
        first = check_int("start_chunk", start_chunk, low=0, high=num_chunks)
        offset = check_int("position_offset", position_offset, low=0, high=MAX_POSITION - num_chunks * self._k)
        index = self._ids
        key_list = keys.tolist()
        fresh = key_list[first:]
        if len(set(fresh)) == len(fresh) and index.keys().isdisjoint(fresh):  # the usual case, in C loops
            picked = list(range(first, num_chunks))
        else:
            picked, batch = [], set()
            for j in range(first, num_chunks):
                key = key_list[j]
                if key not in index and key not in batch:
                    batch.add(key)
                    picked.append(j)
        if not picked:
            return 0
        chunk_index = np.array(picked, dtype=np.int64)
        fps = _chunks(tokens, self._k, self._base)[chunk_index]
        out = np.empty(len(picked), dtype=np.int32)
        self._table = reserve(self._table, len(picked))
        starts = offset + chunk_index * self._k
        done = register_chunks(self._table, tokens, fps, chunk_index, keys[chunk_index], starts, self._dedup, out, 0)
        while done < len(picked):  # stopped before the load would pass 1/4: rebuild (doubled if needed), go on
            self._table = rebuild_slots(self._table)
            done = register_chunks(self._table, tokens, fps, chunk_index, keys[chunk_index], starts, self._dedup, out,
                                   done)
        ids = out.tolist()
        skipped = ids.count(-1)  # dedup_content: not indexed
        picked_keys = fresh if len(picked) == len(fresh) else [key_list[j] for j in picked]
        index.update(zip(picked_keys, ids) if not skipped else
                     ((key, cid) for key, cid in zip(picked_keys, ids) if cid >= 0))
        return len(ids) - skipped

    def match(self, query_token_ids: Sequence[int] | np.ndarray, *, align_tokens: int = 1) -> list[BlendMatch]:
        """Stored chunks found in the query: one result per stored chunk, at its first occurrence (B12, B15).

        Every position ``p`` of the query (or every multiple of ``align_tokens``: the strided
        probe of B19) is fingerprinted; a stored chunk is reported when its full fingerprint
        AND its tokens equal ``query[p : p + chunk_size]``. When its content is stored more
        than once, the copy not yet reported whose stored position is nearest ``p`` is taken
        (ties: smaller ``old_st``, then smaller key), so repeated content in one query takes
        one distinct copy per occurrence. Results may overlap (stride-1 probing); they are
        ordered by ``cur_st``.

        Args:
            query_token_ids: ``uint32``-range token ids (list or 1-D integer array; not a generator).
            align_tokens: probe stride in tokens (``1 .. MAX_ALIGN_TOKENS`` = 2**31 - 1; the engine
                block size for B19's strided probe).

        Returns:
            ``list[BlendMatch]``; ``[]`` when the query is shorter than a chunk or nothing is registered.

        Raises:
            ValueError: tokens not integers in ``[0, 2**32)``, or ``align_tokens`` out of range.
        """
        query = _as_ints("query_token_ids", query_token_ids, _U32_MAX, np.uint32)
        stride = check_int("align_tokens", align_tokens, low=1, high=MAX_ALIGN_TOKENS)
        k = self._k
        if query.shape[0] < k or not self._ids:
            return []
        cur, ids = probe(self._table, query, self._base, stride)
        starts = self._table.start[ids].tolist()
        keys = self._table.key[ids].tolist()
        return [BlendMatch(s, s + k, c, c + k, key) for c, s, key in zip(cur.tolist(), starts, keys)]

    def remove(self, storage_keys: Iterable[int]) -> int:
        """Forget the chunks stored under ``storage_keys`` (B14, with its slot quirk fixed).

        Unknown keys are ignored (as upstream); a key given twice is removed once. A slot is
        cleared only when the removed chunk heads its chain, so other chunks stay findable;
        the compact ids are reused by later registrations.

        Args:
            storage_keys: u64 keys (list or 1-D integer array; a single key goes in a list).

        Returns:
            The number of chunks removed.

        Raises:
            ValueError: ``storage_keys`` not a list / 1-D array, or a key that is not an integer in
                ``[0, 2**64)`` (nothing is removed then).
        """
        if isinstance(storage_keys, (str, bytes)) or not isinstance(storage_keys, (Iterable, np.ndarray)):
            raise ValueError(f"storage_keys must be a list or 1-D integer array of keys (a single key goes in a "
                             f"list), got {storage_keys!r}")
        keys = storage_keys.tolist() if isinstance(storage_keys, np.ndarray) else list(storage_keys)
        _as_ints("storage_keys", keys, _U64_MAX, np.uint64)
        index = self._ids
        ids = [index.pop(key) for key in keys if key in index]
        if ids:
            remove_ids(self._table, np.array(ids, dtype=np.int32))
        return len(ids)
