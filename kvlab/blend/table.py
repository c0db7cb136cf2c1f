"""The chunk table behind :class:`~kvlab.blend.matcher.TokenRangeMatcher`: flat arrays and numba kernels.

LMCache's matcher (docs/specs/index_blend.md D.3) keeps one direct-address table of compact
ids keyed by ``fingerprint & mask`` in which the last write wins (B7/B21), never reuses an
id (B11) and clears a slot on removal whoever holds it (B14). This table keeps the idea (a
slot array of compact ids keyed by the fingerprint, confirmed by the stored full
fingerprint) and fixes those limits:

- **Contents and copies.** A *content* is one distinct chunk of tokens (its full fingerprint
  and its ``chunk_size`` tokens, kept for the exact comparison); a *copy* (a compact id) is
  one registration of a content: its storage key and stored start position. Copies of a
  content form a doubly linked list (``copy_head``/``copy_next``/``copy_prev``), so a content
  stored twice (B15) is compared once per probe and either copy is removed in O(1).
- **Open addressing in groups of 8 slots** (the layout of Abseil's SwissTable): a content
  sits in a free slot of its home group or, when that group is full, of the next group with
  a free slot. One control byte per slot, eight to a ``uint64`` word: 0 empty, 1 deleted,
  ``0x80 | tag`` taken (7 bits of the slot hash). A probe reads one word, finds the bytes
  equal to its tag and whether the group has an empty slot with a few word operations
  (SWAR); only a tag hit reads the slot entry (content id and 32 fingerprint bits), and
  only an entry whose bits agree reads the content's full fingerprint and tokens. So a slot
  collision never hides a chunk, and a miss costs one load of an eighth of the slot memory.
- **Removal** marks exactly the removed content's slot: empty when its group has an empty
  slot (no probe passes that group), else deleted (a tombstone probes walk over). Every
  other content stays findable (B14 fixed).
- **Growth.** Before a new content would bring the taken plus deleted slots above a quarter
  (:data:`LOAD_LIMIT`), the slots are rebuilt without tombstones, doubling while live
  contents would exceed a quarter (:func:`rebuild_slots`).
- **Slot hash = ``fp * SLOT_MULTIPLIER``** (Fibonacci hashing): its top bits pick the group,
  the next 7 the tag, where upstream takes ``fp & mask``. The polynomial's low bits mix
  poorly: for chunks of consecutive token ids (as synthetic workloads allocate them)
  ``sum(base**i, i < 256)`` is a multiple of 256, so all such chunks share their low 16
  fingerprint bits and 100,000 of them fall in 16 of 2**20 slots under ``fp & mask``. The
  full 64-bit fingerprint is upstream's.
- **Id reuse.** Freed content ids and copy ids go on free stacks and are issued again first,
  so ids stay below the peak number of live entries however many registrations happen (B11).

``counts`` holds ``[live contents, live copies, free contents, free copies, issued contents,
issued copies, deleted slots]`` (columns :data:`LIVE_CONTENTS` .. :data:`DELETED_SLOTS`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kvlab.blend.kernels import EMPTY, _rolling
from kvlab.core.jit import kernel_jit

#: Multiplier of the slot hash ``fp * SLOT_MULTIPLIER mod 2**64`` (its top bits: group, then 7 bits of tag).
SLOT_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)
#: Slots per group (one ``uint64`` control word).
GROUP_SLOTS = 8
#: Control bytes: an empty and a deleted slot (a taken slot holds ``0x80 | tag``).
EMPTY_SLOT, DELETED_SLOT = 0, 1
_LO, _HI = np.uint64(0x0101010101010101), np.uint64(0x8080808080808080)
#: A slot entry keeps these fingerprint bits beside the content id: a tag hit is checked in the same load.
FRAGMENT_BITS = np.uint64(0xFFFFFFFF00000000)
_ID_BITS = np.uint64(0xFFFFFFFF)
#: Slots >= LOAD_LIMIT * (taken + deleted slots): at most a quarter taken, so nearly every miss is one control-word
#: load (a half-full table measured 2x slower probes: more spurious tag hits and full groups).
LOAD_LIMIT = 4
#: Columns of :attr:`ChunkTable.counts`.
LIVE_CONTENTS, LIVE_IDS, FREE_CONTENTS, FREE_IDS, ISSUED_CONTENTS, ISSUED_IDS, DELETED_SLOTS = range(7)
#: Initial rows of the content and copy arrays (they double when full).
INITIAL_CAPACITY = 256


class ChunkTable(NamedTuple):
    """Flat state of the chunk table (module docstring): G groups, C contents, I copy ids, k tokens per chunk."""

    control: np.ndarray  # uint64[G]: 8 control bytes per group (byte b: slot 8*g + b)
    slot_entry: np.ndarray  # uint64[8*G]: taken slot: (fingerprint & FRAGMENT_BITS) | content id
    fingerprint: np.ndarray  # uint64[C]: full fingerprint per content
    copies: np.ndarray  # int32[C]: live copies of the content (0: content id free)
    tokens: np.ndarray  # uint32[C, k]: the content's tokens
    copy_head: np.ndarray  # int32[C]: first copy id of the content
    used: np.ndarray  # int32[C]: per-query scratch, copies of the content already reported
    free_contents: np.ndarray  # int32[C]: stack of freed content ids
    key: np.ndarray  # uint64[I]: storage key per copy
    start: np.ndarray  # int64[I]: stored start position per copy, tokens
    content: np.ndarray  # int32[I]: content of the copy (stale once the id is freed)
    copy_next: np.ndarray  # int32[I]
    copy_prev: np.ndarray  # int32[I]
    reported: np.ndarray  # uint8[I]: per-query scratch
    free_ids: np.ndarray  # int32[I]: stack of freed copy ids
    counts: np.ndarray  # int64[7]: see the module docstring


_CONTENT_FIELDS = {"fingerprint": np.uint64, "copies": np.int32, "tokens": np.uint32, "copy_head": np.int32,
                   "used": np.int32, "free_contents": np.int32}
_ID_FIELDS = {"key": np.uint64, "start": np.int64, "content": np.int32, "copy_next": np.int32,
              "copy_prev": np.int32, "reported": np.uint8, "free_ids": np.int32}


def make_table(chunk_size: int, table_bits: int, capacity: int = INITIAL_CAPACITY) -> ChunkTable:
    """An empty table of ``2**table_bits`` slots (``table_bits >= 3``) and rows for ``capacity`` contents and copies.

    Arguments are checked by the caller. Rows are zeros (``calloc``: pages are touched only
    when written); every field of a row is set when its id is issued, and the scratch
    columns are zero between queries.

    Example:
        >>> t = make_table(4, 5)
        >>> t.control.shape, t.slot_entry.shape, t.tokens.shape, t.counts.tolist()
        ((4,), (32,), (256, 4), [0, 0, 0, 0, 0, 0, 0])
    """
    arrays = {name: np.zeros((capacity, chunk_size) if name == "tokens" else capacity, dtype=dtype)
              for name, dtype in (_CONTENT_FIELDS | _ID_FIELDS).items()}
    return ChunkTable(control=np.zeros((1 << table_bits) // GROUP_SLOTS, dtype=np.uint64),
                      slot_entry=np.zeros(1 << table_bits, dtype=np.uint64), counts=np.zeros(7, dtype=np.int64),
                      **arrays)


def reserve(t: ChunkTable, new_chunks: int) -> ChunkTable:
    """``t`` with room for ``new_chunks`` more contents and copies (rows - live entries), rows at least doubled.

    The arrays grow in place (``ndarray.resize``: ``realloc``, no copy of a large block and
    the new rows zero), so no view of a table array may outlive a call: they are private to
    the matcher.
    """
    for fields, live, rows in ((_CONTENT_FIELDS, t.counts[LIVE_CONTENTS], t.fingerprint.shape[0]),
                               (_ID_FIELDS, t.counts[LIVE_IDS], t.key.shape[0])):
        need = int(live) + new_chunks
        if need > rows:
            for name in fields:
                arr = getattr(t, name)
                arr.resize((max(2 * rows, need), *arr.shape[1:]), refcheck=False)
    return t


def rebuild_slots(t: ChunkTable) -> ChunkTable:
    """A copy of ``t`` whose slots hold the live contents only (no tombstones), doubled while
    ``LOAD_LIMIT * (live contents + 1)`` exceeds them."""
    slots = t.slot_entry.shape[0]
    while LOAD_LIMIT * (int(t.counts[LIVE_CONTENTS]) + 1) > slots:
        slots *= 2
    t = t._replace(control=np.zeros(slots // GROUP_SLOTS, dtype=np.uint64), slot_entry=np.zeros(slots, dtype=np.uint64))
    _reinsert(t)
    return t


@kernel_jit(nogil=True, inline="always")
def _group_shift(control):  # noqa: ANN001, ANN202 - 64 - log2(number of groups)
    bits = 0
    while (1 << bits) < control.shape[0]:
        bits += 1
    return np.uint64(64 - bits)


@kernel_jit(nogil=True, inline="always")
def _group_and_tag(fp, shift):  # noqa: ANN001, ANN202 - (home group, control byte 0x80 | tag) of a fingerprint
    m = fp * SLOT_MULTIPLIER
    group = (m >> np.uint64(1)) >> (shift - np.uint64(1))  # two shifts: a shift by 64 (one group) is undefined
    return np.int64(group), np.uint64(0x80) | ((m >> (shift - np.uint64(7))) & np.uint64(0x7F))


@kernel_jit(nogil=True, inline="always")
def _tag_bytes(word, tag):  # noqa: ANN001, ANN202 - high bit of every byte equal to tag (+ false hits above a hit)
    x = word ^ (tag * _LO)
    return (x - _LO) & ~x & _HI


@kernel_jit(nogil=True, inline="always")
def _has_empty(word):  # noqa: ANN001, ANN202 - does the group have an empty slot (a zero control byte)?
    return ((word - _LO) & ~word & _HI) != 0


@kernel_jit(nogil=True, inline="always")
def _lowest_byte(bits):  # noqa: ANN001, ANN202 - index of the lowest byte whose high bit is set
    b = 0
    while (bits >> np.uint64(8 * b + 7)) & np.uint64(1) == 0:
        b += 1
    return b


@kernel_jit(nogil=True, inline="always")
def _control_byte(word, b):  # noqa: ANN001, ANN202
    return (word >> np.uint64(8 * b)) & np.uint64(0xFF)


@kernel_jit(nogil=True, inline="always")
def _set_control(control, slot, value):  # noqa: ANN001, ANN202 - control byte of slot := value
    g, sh = slot // GROUP_SLOTS, np.uint64(8 * (slot % GROUP_SLOTS))
    control[g] = (control[g] & ~(np.uint64(0xFF) << sh)) | (np.uint64(value) << sh)


@kernel_jit(nogil=True, inline="always")
def _same_tokens(stored, c, tokens, at, k):  # noqa: ANN001, ANN202 - stored[c] == tokens[at : at + k]?
    for j in range(k):
        if stored[c, j] != tokens[at + j]:
            return False
    return True


@kernel_jit(nogil=True)
def _find(control, slot_entry, fingerprint, stored, used, copies, tokens, at, fp, group, tag,  # noqa: ANN001, ANN202
          skip_used):  # noqa: ANN001
    """The content equal to ``tokens[at : at + k]`` (fingerprint ``fp``) or EMPTY; with ``skip_used``,
    contents whose copies are all reported this query are passed over."""
    gmask = control.shape[0] - 1
    while True:
        word = control[group]
        hits = _tag_bytes(word, tag)
        while hits != 0:
            b = _lowest_byte(hits)
            entry = slot_entry[group * GROUP_SLOTS + b]
            if _control_byte(word, b) == tag and (entry ^ fp) & FRAGMENT_BITS == 0:
                c = np.int64(entry & _ID_BITS)
                if fingerprint[c] == fp and not (skip_used and used[c] >= copies[c]) and _same_tokens(
                        stored, c, tokens, at, stored.shape[1]):
                    return c
            hits &= hits - np.uint64(1)
        if _has_empty(word):
            return EMPTY
        group = (group + 1) & gmask


@kernel_jit(nogil=True, inline="always")
def _free_slot(control, group):  # noqa: ANN001, ANN202 - first empty or deleted slot from the home group on
    gmask = control.shape[0] - 1
    while True:
        word = control[group]
        for b in range(GROUP_SLOTS):
            if _control_byte(word, b) <= DELETED_SLOT:
                return group * GROUP_SLOTS + b
        group = (group + 1) & gmask


@kernel_jit(nogil=True)
def _reinsert(t):  # noqa: ANN001, ANN202 - put every live content into the (empty) slots
    shift = _group_shift(t.control)
    for c in range(t.counts[ISSUED_CONTENTS]):
        if t.copies[c] > 0:
            group, tag = _group_and_tag(t.fingerprint[c], shift)
            slot = _free_slot(t.control, group)
            _set_control(t.control, slot, tag)
            t.slot_entry[slot] = (t.fingerprint[c] & FRAGMENT_BITS) | np.uint64(c)
    t.counts[DELETED_SLOTS] = 0


@kernel_jit(nogil=True)
def _issue(free, counts, free_col, issued_col):  # noqa: ANN001, ANN202 - pop a freed id, else a never-issued one
    if counts[free_col] > 0:
        counts[free_col] -= 1
        return free[counts[free_col]]
    counts[issued_col] += 1
    return counts[issued_col] - 1


@kernel_jit(nogil=True)
def register_chunks(t, tokens, fps, chunk_index, keys, starts, dedup, out_ids, first):  # noqa: ANN001, ANN201
    """Index chunks ``j = first, first + 1, ...``: chunk ``chunk_index[j]`` of ``tokens`` (fingerprint
    ``fps[j]``) as a copy with key ``keys[j]`` at ``starts[j]``.

    ``out_ids[j]`` receives the copy id, or EMPTY when ``dedup`` and the content is already
    live (B10; a duplicate earlier in the batch included). The caller has reserved rows and
    filtered already-registered keys. Stops before a new content would take the taken plus
    deleted slots above a quarter; returns the next ``j`` (``len(fps)`` when done): rebuild the
    slots and call again.
    """
    k = t.tokens.shape[1]
    control, fingerprint, copies, copy_head = t.control, t.fingerprint, t.copies, t.copy_head
    shift = _group_shift(control)
    for j in range(first, fps.shape[0]):
        at = chunk_index[j] * k
        fp = fps[j]
        group, tag = _group_and_tag(fp, shift)
        c = _find(control, t.slot_entry, fingerprint, t.tokens, t.used, copies, tokens, at, fp, group, tag, False)
        if c != EMPTY and dedup:
            out_ids[j] = EMPTY
            continue
        if c == EMPTY:
            if LOAD_LIMIT * (t.counts[LIVE_CONTENTS] + t.counts[DELETED_SLOTS] + 1) > t.slot_entry.shape[0]:
                return j
            c = _issue(t.free_contents, t.counts, FREE_CONTENTS, ISSUED_CONTENTS)
            t.counts[LIVE_CONTENTS] += 1
            slot = _free_slot(control, group)
            if _control_byte(control[slot // GROUP_SLOTS], slot % GROUP_SLOTS) == DELETED_SLOT:
                t.counts[DELETED_SLOTS] -= 1
            _set_control(control, slot, tag)
            t.slot_entry[slot] = (fp & FRAGMENT_BITS) | np.uint64(c)
            fingerprint[c] = fp
            copies[c] = 0
            t.tokens[c, :] = tokens[at:at + k]
            copy_head[c] = EMPTY
        i = _issue(t.free_ids, t.counts, FREE_IDS, ISSUED_IDS)
        t.counts[LIVE_IDS] += 1
        t.key[i] = keys[j]
        t.start[i] = starts[j]
        t.content[i] = c
        t.copy_prev[i] = EMPTY
        t.copy_next[i] = copy_head[c]
        if copy_head[c] != EMPTY:
            t.copy_prev[copy_head[c]] = i
        copy_head[c] = i
        copies[c] += 1
        out_ids[j] = i
    return fps.shape[0]


@kernel_jit(nogil=True)
def _free_content_slot(t, c, shift):  # noqa: ANN001, ANN202 - mark exactly content c's slot empty or deleted
    control = t.control
    group, tag = _group_and_tag(t.fingerprint[c], shift)
    gmask = control.shape[0] - 1
    while True:
        word = control[group]
        for b in range(GROUP_SLOTS):
            slot = group * GROUP_SLOTS + b
            if _control_byte(word, b) == tag and t.slot_entry[slot] & _ID_BITS == np.uint64(c):
                if _has_empty(word):  # no probe walks past this group: the slot can be empty again
                    _set_control(control, slot, EMPTY_SLOT)
                else:
                    _set_control(control, slot, DELETED_SLOT)
                    t.counts[DELETED_SLOTS] += 1
                return
        group = (group + 1) & gmask


@kernel_jit(nogil=True)
def remove_ids(t, ids):  # noqa: ANN001, ANN201
    """Unlink the live copy ids ``ids``; a content left without copies frees exactly its own slot (B14 fixed).

    Freed copy ids and content ids go on the free stacks.
    """
    shift = _group_shift(t.control)
    for i in ids:
        c = t.content[i]
        prev, nxt = t.copy_prev[i], t.copy_next[i]
        if prev != EMPTY:
            t.copy_next[prev] = nxt
        else:
            t.copy_head[c] = nxt
        if nxt != EMPTY:
            t.copy_prev[nxt] = prev
        t.free_ids[t.counts[FREE_IDS]] = i
        t.counts[FREE_IDS] += 1
        t.counts[LIVE_IDS] -= 1
        t.copies[c] -= 1
        if t.copies[c] == 0:
            _free_content_slot(t, c, shift)
            t.free_contents[t.counts[FREE_CONTENTS]] = c
            t.counts[FREE_CONTENTS] += 1
            t.counts[LIVE_CONTENTS] -= 1


@kernel_jit(nogil=True)
def _nearest_copy(t, c, pos):  # noqa: ANN001, ANN202 - unreported copy of c nearest pos; ties: smaller start, then key
    best, best_dist, best_start, best_key = EMPTY, np.int64(0), np.int64(0), np.uint64(0)
    i = t.copy_head[c]
    while i != EMPTY:
        if t.reported[i] == 0:
            st = t.start[i]
            dist = st - pos if st >= pos else pos - st
            if best == EMPTY or dist < best_dist or (dist == best_dist and (
                    st < best_start or (st == best_start and t.key[i] < best_key))):
                best, best_dist, best_start, best_key = i, dist, st, t.key[i]
        i = t.copy_next[i]
    return best


@kernel_jit(nogil=True)
def probe(t, query, base, stride):  # noqa: ANN001, ANN201
    """Match ``query`` (``uint32[n]``, ``n >= k``) at positions ``0, stride, 2*stride, ...`` (B12, B15, B19).

    Positions are visited in order. At each, the home group's control word of the window's
    fingerprint is read; with no tag hit and an empty slot (most positions) that is a miss.
    Otherwise the content whose tag, full fingerprint and tokens all equal the window's and
    that still has an unreported copy is the match (``_find``), and its nearest unreported
    copy (``_nearest_copy``) is reported at that position. Returns ``(cur_st int64[r], copy
    ids int32[r])`` in position order; the per-query scratch is zero again on return.
    """
    k = t.tokens.shape[1]
    hashes = _rolling(query, k, base)
    control, slot_entry, fingerprint, copies, used, stored = (t.control, t.slot_entry, t.fingerprint, t.copies,
                                                              t.used, t.tokens)
    reported = t.reported
    shift = _group_shift(control)
    n_out = min((hashes.shape[0] + stride - 1) // stride, t.counts[LIVE_IDS])
    cur = np.empty(n_out, dtype=np.int64)
    ids = np.empty(n_out, dtype=np.int32)
    touched = np.empty(n_out, dtype=np.int32)
    r = 0
    num_touched = 0
    for pos in range(0, hashes.shape[0], stride):
        h = hashes[pos]
        group, tag = _group_and_tag(h, shift)
        word = control[group]
        if _tag_bytes(word, tag) == 0 and _has_empty(word):
            continue
        c = _find(control, slot_entry, fingerprint, stored, used, copies, query, pos, h, group, tag, True)
        if c == EMPTY:
            continue  # no such content, all its copies reported, or a fingerprint collision with other tokens
        i = _nearest_copy(t, c, pos)
        reported[i] = 1
        if used[c] == 0:
            touched[num_touched] = c
            num_touched += 1
        used[c] += 1
        cur[r] = pos
        ids[r] = i
        r += 1
        if r == n_out:
            break
    for j in range(r):
        reported[ids[j]] = 0
    for j in range(num_touched):
        used[touched[j]] = 0
    return cur[:r], ids[:r]
