"""The loaders' chaining check: every block key always follows the same parent key at the same
position (docs/DESIGN.md "Data model": equal key ⇒ equal whole prefix)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from kvlab.core.jit import kernel_jit
from kvlab.traces.errors import TraceFormatError
from kvlab.traces.flat import FlatTrace, intern_first_seen


def check_chained_keys(flat: FlatTrace, path: str | Path, *, field: str = "block_keys", noun: str = "key",
                       lines: object = None, names: Sequence[str] | None = None) -> None:
    """Raise at the first block reference whose key was seen before with another parent key or
    at another position (a key repeated inside one request is one such case).

    Every trace file reader calls it (:func:`kvlab.traces.load_mooncake`, the kvlab Parquet
    reader); :meth:`kvlab.traces.Trace.check_chained` lists every offending key instead.

    Args:
        flat: the trace's flat form (:attr:`kvlab.traces.Trace.flat`).
        path: the file, named in the error.
        field: the column or JSON field of the keys, named in the error (``block_keys``,
            Mooncake's ``hash_ids``).
        noun: what the error calls one key (``key``, Mooncake's ``id``).
        lines: ``int[num_requests]``, the 1-based line of each request in the file (text
            formats: the error names the lines); ``None`` names 0-based rows instead.
        names: what the file calls each request (``requests[17]`` in a one-document JSON
            file), named instead of the row, before ``field`` (``requests[17].hash_ids[3]``);
            ``None``: rows (or lines) only.

    Raises:
        TraceFormatError: naming the file, the row (or line) of the offending reference,
            the key, both parents and positions and the row (or line) where the key was
            first seen.

    Example:
        >>> import polars as pl
        >>> from kvlab.traces.flat import flatten_block_keys
        >>> keys = pl.Series([[1, 2], [3, 2]], dtype=pl.List(pl.UInt64))
        >>> check_chained_keys(flatten_block_keys(keys, pl.Series([8, 8]), 4), "t.parquet")
        Traceback (most recent call last):
        ...
        kvlab.traces.errors.TraceFormatError: t.parquet: row 1: block_keys[1]=2 follows key 3 here but key 1 \
at position 1 in row 0: the keys are not prefix-chained
    """
    ref, ref0 = _first_unchained(flat.offsets, flat.block_ids, flat.num_keys)
    if ref < 0:
        return
    row, row0 = (int(r) for r in np.searchsorted(flat.offsets, [ref, ref0], side="right") - 1)
    ids = flat.block_ids

    def position_and_parent(ref: int, row: int) -> tuple[int, int]:
        position = ref - int(flat.offsets[row])
        return position, (-1 if position == 0 else int(ids[ref - 1]))

    def after(parent_id: int) -> str:
        return "nothing (first block)" if parent_id < 0 else f"{noun} {int(flat.keys[parent_id])}"

    (position, parent), (position0, parent0) = position_and_parent(ref, row), position_and_parent(ref0, row0)
    named = "" if names is None else f"{names[row]}."
    here = (f"{named}{field}[{position}]={int(flat.keys[ids[ref]])} follows {after(parent)} here but "
            f"{after(parent0)} at position {position0}")
    if lines is None:
        where, where0 = (f"row {row}: ", f"row {row0}") if names is None else ("", names[row0])
        raise TraceFormatError(path, None, f"{where}{here} in {where0}: the {noun}s are not prefix-chained")
    lines = np.asarray(lines)
    where0 = "" if names is None else f" in {names[row0]}"
    raise TraceFormatError(path, int(lines[row]), f"{here}{where0} on line {int(lines[row0])}: the {noun}s are not "
                                                  f"prefix-chained")


@kernel_jit(nogil=True)
def _first_unchained(offsets: np.ndarray, block_ids: np.ndarray, num_keys: int) -> tuple[int, int]:
    """``(ref, first_ref)``: the first reference whose id was seen first (at reference
    ``first_ref``) with another parent id or at another position; ``(-1, -1)`` if none. One
    pass in reference order, remembering each id's first parent and position."""
    parent_of = np.empty(num_keys, dtype=np.int32)
    position_of = np.empty(num_keys, dtype=np.int64)
    first_ref = np.full(num_keys, -1, dtype=np.int64)
    for r in range(offsets.shape[0] - 1):
        parent = -1
        for ref in range(offsets[r], offsets[r + 1]):
            key = block_ids[ref]
            position = ref - offsets[r]
            if first_ref[key] < 0:
                first_ref[key] = ref
                parent_of[key] = parent
                position_of[key] = position
            elif parent_of[key] != parent or position_of[key] != position:
                return ref, first_ref[key]
            parent = key
    return -1, -1


def rechain(offsets: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Prefix-chained keys for ids that name one block (or segment) each, not its whole prefix.

    The key of reference ``i`` of a request stands for the request's ids ``0..i`` in order: a new
    key for each distinct ``(key of the previous reference, id)`` pair, numbered ``0, 1, …`` in
    order of first appearance (exact: pairs are interned, not hashed). Bailian's per-block
    SipHash ids and RAGPulse's segment ids need it (docs/specs/traces.md §2.2); ids that are
    chained already come back renumbered, with the same equalities.

    Args:
        offsets: ``int64[num_requests + 1]``, CSR row pointers into ``ids``.
        ids: ``uint64[num_refs]``, the per-block (or per-segment) ids in prompt order.

    Returns:
        ``uint64[num_refs]``: the chained keys.

    Raises:
        ValueError: offsets not a non-decreasing pointer array from 0 to ``len(ids)``.

    Example:
        >>> offsets = np.array([0, 2, 4, 5])
        >>> rechain(offsets, np.array([7, 9, 8, 9, 7], dtype=np.uint64)).tolist()  # 9 after 7 ≠ 9 after 8
        [0, 1, 2, 3, 0]
    """
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    ids = np.ascontiguousarray(ids, dtype=np.uint64)
    if offsets.ndim != 1 or offsets.shape[0] < 1 or offsets[0] != 0 or offsets[-1] != ids.shape[0] or (
            np.diff(offsets) < 0).any():
        raise ValueError(f"offsets must run from 0 to len(ids)={ids.shape[0]} without decreasing")
    dense, _ = intern_first_seen(ids)
    return _rechain(offsets, dense.astype(np.int64)).astype(np.uint64)


@kernel_jit(nogil=True)
def _rechain(offsets: np.ndarray, dense: np.ndarray) -> np.ndarray:
    """New ids for ``(previous new id + 1, dense id)`` pairs, coded ``(parent + 1) * R + id`` (R =
    distinct ids + 1; below 2**63 as both factors are below the number of references), interned in
    an open-addressing table (linear probing, load factor at most 1/2)."""
    n = dense.shape[0]
    out = np.empty(n, dtype=np.int64)
    radix = 1
    for i in range(n):
        radix = max(radix, dense[i] + 2)
    cap = 1024
    while cap < 2 * n + 2:
        cap *= 2
    slot_code = np.full(cap, -1, dtype=np.int64)
    slot_id = np.empty(cap, dtype=np.int64)
    mask = cap - 1
    count = 0
    for r in range(offsets.shape[0] - 1):
        parent = -1
        for ref in range(offsets[r], offsets[r + 1]):
            code = (parent + 1) * radix + dense[ref]
            z = np.uint64(code) * np.uint64(0x9E3779B97F4A7C15)
            s = np.int64(z >> np.uint64(33)) & mask
            while slot_code[s] >= 0 and slot_code[s] != code:
                s = (s + 1) & mask
            if slot_code[s] < 0:
                slot_code[s] = code
                slot_id[s] = count
                count += 1
            parent = slot_id[s]
            out[ref] = parent
    return out


def segment_block_keys(offsets: np.ndarray, segment_ids: np.ndarray, segment_tokens: np.ndarray,
                       input_tokens: np.ndarray, block_size: int, *, partial_block_keyed: bool = False
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Prefix-semantics block keys for prompts made of variable-length segments (RAGPulse).

    Request ``r``'s prompt is its segments ``offsets[r]:offsets[r + 1]`` in order, then
    ``input_tokens[r] - sum(their tokens)`` tail tokens (a template) unique to the request. The
    segments are chained (:func:`rechain`: one key per distinct sequence of segments), and the key
    of each ``block_size``-token block (the last one partial) is the exact interning of (the chained
    key of the segment holding the block's last token, that token's offset in the segment): equal
    block keys ⇔ the same segments in the same order up to that token, so a prefix hit means the
    same segments in the same order. Blocks whose last token is a tail token are never shared.
    Keys are numbered ``0, 1, …`` in order of first appearance.

    Args:
        offsets: ``int64[num_requests + 1]`` CSR row pointers into the segment arrays.
        segment_ids: ``uint64[num_segments]`` segment ids (equal id ⇔ equal tokens).
        segment_tokens: ``int[num_segments]`` tokens of each segment (≥ 0).
        input_tokens: ``int[num_requests]`` prompt tokens, ≥ the request's segment tokens.
        block_size: tokens per block (≥ 1).
        partial_block_keyed: key a trailing partial block too (``ceil`` rather than ``floor``).

    Returns:
        ``(block_offsets, block_keys)``: ``int64[num_requests + 1]`` and ``uint64[num_blocks]``,
        ``floor(input_tokens / block_size)`` keys per request (``ceil`` with ``partial_block_keyed``).

    Raises:
        ValueError: bad offsets, lengths that differ, or a prompt shorter than its segments.

    Example:
        >>> off = np.array([0, 2, 4])  # 16-token blocks over segments of 20 and 12 tokens + 2 tail
        >>> _, keys = segment_block_keys(off, np.array([5, 6, 5, 7], dtype=np.uint64), np.array([20, 12, 20, 12]),
        ...                              np.array([34, 34]), 16, partial_block_keyed=True)
        >>> keys.tolist()  # block 0 shared (segment 5 only); block 1 ends in 6 vs 7; tails unique
        [0, 1, 2, 0, 3, 4]
    """
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    seg_ids = np.ascontiguousarray(segment_ids, dtype=np.uint64)
    seg_tok = np.ascontiguousarray(segment_tokens, dtype=np.int64)
    inputs = np.ascontiguousarray(input_tokens, dtype=np.int64)
    n = inputs.shape[0]
    if offsets.shape != (n + 1,) or seg_tok.shape != seg_ids.shape:
        raise ValueError(f"offsets must have num_requests + 1 = {n + 1} entries and segment_tokens one per "
                         f"segment id; got {offsets.shape[0]} offsets, {seg_tok.shape[0]} token counts, "
                         f"{seg_ids.shape[0]} ids")
    rows = np.repeat(np.arange(n), np.diff(offsets))
    tail = inputs - np.bincount(rows, weights=seg_tok, minlength=n).astype(np.int64)
    if (tail < 0).any() or (seg_tok < 0).any():
        r = int(np.argmax(tail < 0)) if (tail < 0).any() else int(rows[np.argmax(seg_tok < 0)])
        raise ValueError(f"request {r}: input_tokens={inputs[r]} is less than its segments' tokens, or a "
                         "segment has a negative token count")
    # the extended segments: each request's own, then its tail as a pseudo-segment with a unique id
    dense = np.unique(seg_ids, return_inverse=True)[1].reshape(-1).astype(np.uint64)
    has_tail = tail > 0
    ext_off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.diff(offsets) + has_tail, out=ext_off[1:])
    ext_ids = np.empty(ext_off[-1], dtype=np.uint64)
    ext_tok = np.empty(ext_off[-1], dtype=np.int64)
    where = ext_off[rows] + (np.arange(seg_ids.shape[0]) - offsets[rows])
    ext_ids[where], ext_tok[where] = dense, seg_tok
    tails = ext_off[1:][has_tail] - 1
    ext_ids[tails] = np.uint64(dense.max(initial=0) + 1) + np.flatnonzero(has_tail).astype(np.uint64)
    ext_tok[tails] = tail[has_tail]
    prefix = rechain(ext_off, ext_ids).astype(np.int64)
    block_size = int(block_size)
    nblk = -(-inputs // block_size) if partial_block_keyed else inputs // block_size
    blk_off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(nblk, out=blk_off[1:])
    # exact and dense: a chained segment always starts at the same prompt position, so the block
    # ends inside it sit at offsets congruent mod block_size and offset // block_size tells them
    # apart; each chained segment gets a range of len // block_size + 1 codes
    seg_len = np.zeros(int(prefix.max(initial=-1)) + 1, dtype=np.int64)
    seg_len[prefix] = ext_tok
    base = np.zeros(seg_len.shape[0] + 1, dtype=np.int64)
    np.cumsum(seg_len // block_size + 1, out=base[1:])
    codes = _block_codes(ext_off, ext_tok, prefix, base, inputs, blk_off, block_size)
    return blk_off, intern_first_seen(codes)[0].astype(np.uint64)


@kernel_jit(nogil=True)
def _block_codes(ext_off: np.ndarray, ext_tok: np.ndarray, prefix: np.ndarray, base: np.ndarray,
                 inputs: np.ndarray, blk_off: np.ndarray, block_size: int) -> np.ndarray:
    """``uint64[num_blocks]``: ``base[chained segment holding the block's last token] + its offset //
    block_size``, walking each request's segments once."""
    out = np.empty(blk_off[-1], dtype=np.uint64)
    for r in range(inputs.shape[0]):
        seg = ext_off[r]
        start = 0  # prompt position where segment ``seg`` starts
        for j in range(blk_off[r + 1] - blk_off[r]):
            last = min((j + 1) * block_size, inputs[r]) - 1
            while start + ext_tok[seg] <= last:
                start += ext_tok[seg]
                seg += 1
            out[blk_off[r] + j] = np.uint64(base[prefix[seg]] + (last - start) // block_size)
    return out
