"""kvlab.blend.matcher and kvlab.blend.ranges: T-B9..T-B28 and the derived checks of docs/specs/index_blend.md
D.4 exactly, the issue's cases (a) and (b), the fixed upstream limits (B11, B14, B21), and a differential
test against a plain-Python matcher."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.blend import kernels
from kvlab.blend.kernels import BLEND_BASE, chunk_hashes
from kvlab.blend.matcher import BlendMatch, TokenRangeMatcher
from kvlab.blend.ranges import (
    classify,
    group_consecutive,
    leftmost_non_overlapping,
    prefix_run_tokens,
    unique_token_coverage,
)
from kvlab.blend.savings import prefill_savings
from kvlab.blend.table import DELETED_SLOTS, _group_and_tag, _group_shift

C = 256  # chunk size of the upstream test_blend_matcher.py scenarios
M64 = 1 << 64


def chunk(seed: int) -> list[int]:
    """256 distinct consecutive token ids per seed (upstream's ``_chunk``)."""
    return [seed * C + i + 1 for i in range(C)]


def spans(matches: list[BlendMatch]) -> list[tuple[int, int, int, int]]:
    return [(m.old_st, m.old_ed, m.cur_st, m.cur_ed) for m in matches]


def classes(matches: list[BlendMatch]) -> list[str]:
    prefix = prefix_run_tokens(matches)
    return [classify(m, prefix) for m in matches]


# --- T-B9..T-B18: chunk size 4 ------------------------------------------------------------------

def test_tb9_nothing_registered():
    assert TokenRangeMatcher(4).match([1, 2, 3, 4, 5]) == []


def test_tb10_query_shorter_than_chunk():
    m = TokenRangeMatcher(4)
    m.register(list(range(1, 9)), [1, 2])
    assert m.match([1, 2, 3]) == []


def test_tb11_partial_chunk_not_registered():
    m = TokenRangeMatcher(4)
    assert m.register([1, 2, 3], []) == 0
    assert len(m) == 0
    assert m.match([1, 2, 3, 4, 5]) == []


def test_tb12_storage_key_is_the_registered_key():
    m = TokenRangeMatcher(4)
    key = 0xDEADBEEFCAFEF00D
    m.register([10, 20, 30, 40], [key])
    assert m.match([10, 20, 30, 40, 99]) == [BlendMatch(0, 4, 0, 4, key)]


def test_tb13_full_sequence():
    m = TokenRangeMatcher(4)
    m.register(list(range(1, 9)), [7, 8])
    assert spans(m.match(list(range(1, 9)))) == [(0, 4, 0, 4), (4, 8, 4, 8)]


def test_tb14_shifted_inside_query():
    m = TokenRangeMatcher(4)
    m.register([1, 2, 3, 4], [5])
    assert spans(m.match([100, 200, 1, 2, 3, 4, 300])) == [(0, 4, 2, 6)]


def test_tb15_second_chunk_shifted():
    m = TokenRangeMatcher(4)
    m.register(list(range(1, 9)), [5, 6])
    assert spans(m.match([100, 200, 300, 5, 6, 7, 8, 400])) == [(4, 8, 3, 7)]


def test_tb16_disjoint():
    m = TokenRangeMatcher(4)
    m.register([1, 2, 3, 4], [1])
    assert m.match([5, 6, 7, 8, 9]) == []


def test_tb17_two_calls():
    m = TokenRangeMatcher(4)
    m.register([1, 2, 3, 4], [1])
    m.register([5, 6, 7, 8], [2])
    assert len(m.match(list(range(1, 9)))) == 2


def test_tb18_chunk256_after_filler():
    m = TokenRangeMatcher(C)
    a, b = list(range(1000, 1000 + C)), list(range(2000, 2000 + C))
    m.register(a + b, [11, 22])
    assert m.match(list(range(5000, 5000 + C)) + a) == [BlendMatch(0, 256, 256, 512, 11)]


# --- T-B19..T-B28: chunk size 256 ---------------------------------------------------------------

def test_tb19_four_prefix_hits():
    m = TokenRangeMatcher(C)
    stored = chunk(1) + chunk(2) + chunk(3) + chunk(4)
    m.register(stored, [101, 102, 103, 104])
    got = m.match(stored)
    assert [(r.cur_st, r.old_st) for r in got] == [(0, 0), (256, 256), (512, 512), (768, 768)]
    assert prefix_run_tokens(got) == 1024
    assert classes(got) == ["prefix"] * 4


def test_tb20_aligned_after_a_break():
    m = TokenRangeMatcher(C)
    m.register(chunk(1) + chunk(2) + chunk(3) + chunk(4), [301, 302, 303, 304])
    got = m.match(chunk(99) + chunk(2) + chunk(3) + chunk(4))
    assert [(r.cur_st, r.old_st) for r in got] == [(256, 256), (512, 512), (768, 768)]
    assert prefix_run_tokens(got) == 0
    assert classes(got) == ["aligned"] * 3


def test_tb21_one_shifted_hit():
    m = TokenRangeMatcher(C)
    m.register(chunk(1) + chunk(2), [401, 402])
    got = m.match(chunk(50) + chunk(51) + chunk(52) + chunk(2))
    assert [(r.old_st, r.cur_st, r.storage_key) for r in got] == [(256, 768, 402)]
    assert classes(got) == ["shifted"]


def test_tb22_position_offset_gives_aligned_hits():
    m = TokenRangeMatcher(C)
    assert m.register(chunk(2) + chunk(3), [502, 503], position_offset=256) == 2
    got = m.match(chunk(77) + chunk(2) + chunk(3))
    assert spans(got) == [(256, 512, 256, 512), (512, 768, 512, 768)]
    assert classes(got) == ["aligned", "aligned"]


def test_tb23_two_copies_evicted_one_by_one():
    m = TokenRangeMatcher(C)
    a = chunk(1)
    m.register(a, [101])
    m.register(a, [202], position_offset=256)
    assert [(r.storage_key, r.old_st) for r in m.match(a)] == [(101, 0)]
    assert m.remove([101]) == 1
    assert [(r.storage_key, r.old_st) for r in m.match(a)] == [(202, 256)]
    assert m.remove([202]) == 1
    assert m.match(a) == []


@pytest.mark.parametrize("order", [(0, 1024), (1024, 0)])
def test_tb24_nearest_copy_regardless_of_order(order):
    m = TokenRangeMatcher(C)
    a = chunk(1)
    for offset in order:
        m.register(a, [offset + 7], position_offset=offset)
    filler = chunk(60) + chunk(61) + chunk(62)
    assert [(r.cur_st, r.old_st) for r in m.match(filler + a)] == [(768, 1024)]
    assert [(r.cur_st, r.old_st) for r in m.match(a + chunk(63))] == [(0, 0)]


@pytest.mark.parametrize("reverse", [False, True])
def test_nearest_copy_ties(reverse):
    """Equally near copies: the smaller old_st wins, then the smaller key; never the registration order."""
    a = chunk(1)
    m = TokenRangeMatcher(C)
    regs = [(a, 11, 0), (a, 12, 512), (a, 9, 512)]
    for toks, key, offset in reversed(regs) if reverse else regs:
        m.register(toks, [key], position_offset=offset)
    assert [(r.cur_st, r.old_st, r.storage_key) for r in m.match(chunk(70) + a)] == [(256, 0, 11)]
    m.remove([11])
    assert [(r.cur_st, r.old_st, r.storage_key) for r in m.match(chunk(70) + a)] == [(256, 512, 9)]


def test_tb25_repeated_content_takes_distinct_copies():
    m = TokenRangeMatcher(C)
    a = chunk(1)
    m.register(a, [1])
    m.register(a, [2], position_offset=512)
    got = m.match(a + chunk(40) + a)
    assert [(r.cur_st, r.old_st) for r in got] == [(0, 0), (512, 512)]
    assert m.match(a + a + a)[2:] == []  # two copies: the third occurrence finds none left


def test_tb26_dedup_content_keeps_the_first():
    m = TokenRangeMatcher(C, dedup_content=True)
    a = chunk(1)
    assert m.register(a, [101]) == 1
    assert m.register(a, [202], position_offset=256) == 0
    assert [r.storage_key for r in m.match(a)] == [101]
    assert m.remove([202]) == 0  # never indexed
    assert [r.storage_key for r in m.match(a)] == [101]
    assert m.remove([101]) == 1
    assert m.register(a, [202], position_offset=256) == 1
    assert [(r.storage_key, r.old_st) for r in m.match(a)] == [(202, 256)]


def test_tb27_dedup_inside_one_batch():
    m = TokenRangeMatcher(C, dedup_content=True)
    a = chunk(1)
    assert m.register(a + a, [101, 102]) == 1
    assert [r.storage_key for r in m.match(a)] == [101]
    assert 102 not in m


def test_tb28_strided_probe():
    m = TokenRangeMatcher(C)
    a = chunk(1)
    m.register(a + chunk(2), [801, 802])
    shim = list(range(70000, 70032))
    got = m.match(shim + a, align_tokens=16)
    assert [(r.old_st, r.cur_st, r.storage_key) for r in got] == [(0, 32, 801)]
    # the strided probe reports a chunk at its first block-aligned occurrence (upstream TestStridedProbe)
    query = list(range(9000, 9008)) + a + list(range(9100, 9108)) + a  # a at 8 (unaligned), then at 272
    assert [r.cur_st for r in m.match(query)] == [8]
    assert [r.cur_st for r in m.match(query, align_tokens=16)] == [272]


# --- D.4 derived checks (B16-B18) ---------------------------------------------------------------

def ranges_of(*cur: tuple[int, int]) -> list[BlendMatch]:
    return [BlendMatch(0, ed - st, st, ed, i) for i, (st, ed) in enumerate(cur)]


def test_derived_coverage():
    assert unique_token_coverage(ranges_of((0, 4), (2, 6))) == 6
    assert unique_token_coverage(ranges_of((0, 4), (4, 8))) == 8
    assert unique_token_coverage(ranges_of((0, 8), (2, 4))) == 8
    assert unique_token_coverage([]) == 0


def test_derived_leftmost_dedup():
    ms = ranges_of((0, 4), (2, 6), (4, 8))
    assert [(m.cur_st, m.cur_ed) for m in leftmost_non_overlapping(ms)] == [(0, 4), (4, 8)]
    assert [(m.cur_st, m.cur_ed) for m in leftmost_non_overlapping(ms, prefix_tokens=4)] == [(4, 8)]
    # the prefix filter comes first: (2, 6) must not shadow (4, 8) although it is dropped
    assert [(m.cur_st, m.cur_ed) for m in leftmost_non_overlapping(ranges_of((2, 6), (4, 8)), 4)] == [(4, 8)]


def test_derived_grouping():
    groups = group_consecutive(ranges_of((10, 14), (4, 8), (0, 4)))
    assert [[(m.cur_st, m.cur_ed) for m in g] for g in groups] == [[(0, 4), (4, 8)], [(10, 14)]]


def test_ranges_reject_bad_prefix():
    with pytest.raises(ValueError, match="prefix_tokens"):
        leftmost_non_overlapping([], prefix_tokens=-1)
    with pytest.raises(ValueError, match="prefix_tokens"):
        classify(BlendMatch(0, 4, 0, 4, 1), prefix_tokens=1.5)


# --- the cases (a) and (b) --------------------------------------------------------------

def test_case_a_every_chunk_hits_in_another_order():
    m = TokenRangeMatcher(C)
    m.register(chunk(1) + chunk(2) + chunk(3) + chunk(4), [1, 2, 3, 4])
    got = m.match(chunk(4) + chunk(3) + chunk(2) + chunk(1))
    assert [(r.cur_st, r.old_st, r.storage_key) for r in got] == [(0, 768, 4), (256, 512, 3), (512, 256, 2),
                                                                   (768, 0, 1)]
    assert unique_token_coverage(got) == 1024
    assert leftmost_non_overlapping(got) == got
    assert group_consecutive(got) == [got]
    assert prefix_run_tokens(got) == 0
    assert classes(got) == ["shifted"] * 4


def shortest_collision(base: int) -> tuple[int, int]:
    """(d0, d1) with d0 * base + d1 == 0 mod 2**64 and both small: Lagrange-Gauss reduction of the lattice
    spanned by (1, -base) and (0, 2**64). Raising the second-to-last token of a chunk by d0 and the last by d1
    keeps its fingerprint (the hash is linear)."""
    u, v = (1, (-base) % M64), (0, M64)

    def norm(x: tuple[int, int]) -> int:
        return x[0] ** 2 + x[1] ** 2

    if norm(u) > norm(v):
        u, v = v, u
    while True:
        dot = u[0] * v[0] + u[1] * v[1]
        q = (2 * dot + norm(u)) // (2 * norm(u))  # round(dot / |u|^2), exactly
        v = (v[0] - q * u[0], v[1] - q * u[1])
        if norm(v) >= norm(u):
            return u
        u, v = v, u


@pytest.mark.parametrize("base", [BLEND_BASE, 31])
def test_case_b_crafted_fingerprint_collision_is_no_match(base):
    d0, d1 = shortest_collision(base)
    assert (d0 * base + d1) % M64 == 0 and max(abs(d0), abs(d1)) < 2**32  # fits uint32 token ids
    x = chunk(3)
    x[-2] = 2**32 - 1 if d0 < 0 else 0
    x[-1] = 2**32 - 1 if d1 < 0 else 0
    y = x[:-2] + [x[-2] + d0, x[-1] + d1]
    assert x != y and min(y) >= 0 and max(y) < 2**32
    fx, fy = (chunk_hashes(np.array(t, dtype=np.uint32), C, base)[0] for t in (x, y))
    assert fx == fy  # same full fingerprint, hence the same slot
    m = TokenRangeMatcher(C, base=base)
    m.register(x, [1])
    assert m.match(y) == []  # no KV reused on a fingerprint alone
    assert [r.storage_key for r in m.match(x)] == [1]
    m.register(y, [2])
    assert [r.storage_key for r in m.match(y)] == [2]
    assert [r.storage_key for r in m.match(x)] == [1]
    assert m.match(y + x) == [BlendMatch(0, C, 0, C, 2), BlendMatch(0, C, C, 2 * C, 1)]


def test_base31_adjacent_token_collision():
    """The issue's base-31 recipe: raise one token by 1 and lower the next by 31."""
    x = chunk(5)
    y = list(x)
    y[10] += 1
    y[11] -= 31
    m = TokenRangeMatcher(C, base=31)
    m.register(x, [9])
    assert chunk_hashes(np.array(y), C, 31)[0] == chunk_hashes(np.array(x), C, 31)[0]
    assert m.match(y) == []


# --- the fixed upstream limits ------------------------------------------------------------------

def same_group_chunks(n: int, table_bits: int, same_tag: bool, k: int = 2) -> list[list[int]]:
    """``n`` distinct chunks of ``k`` tokens whose fingerprints share the home group (and the tag) at ``table_bits``."""
    shift = _group_shift(np.zeros(2 ** table_bits // 8, dtype=np.uint64))
    rng = np.random.default_rng(0)
    found: list[list[int]] = []
    want = None
    while len(found) < n:
        toks = rng.integers(0, 2**32, size=k, dtype=np.uint32)
        g, tag = _group_and_tag(chunk_hashes(toks, k)[0], shift)
        if want is None:
            want = (g, tag)
        if g == want[0] and (not same_tag or tag == want[1]):
            found.append(toks.tolist())
    return found


def test_slot_collisions_keep_every_chunk_findable():
    chunks = same_group_chunks(3, 6, same_tag=True)
    m = TokenRangeMatcher(2, table_bits=6)
    for key, toks in enumerate(chunks):
        m.register(toks, [key])
    for key, toks in enumerate(chunks):
        assert [r.storage_key for r in m.match(toks)] == [key]
    m.remove([1])  # B14 fixed: only that chunk goes
    assert [r.storage_key for r in m.match(chunks[0] + chunks[2])] == [0, 2]
    assert m.match(chunks[1]) == []


def test_full_group_overflow_tombstone_and_reuse():
    chunks = same_group_chunks(12, 6, same_tag=False)  # 8 fill the home group, the rest overflow
    m = TokenRangeMatcher(2, table_bits=6)
    for key, toks in enumerate(chunks[:10]):
        assert m.register(toks, [key]) == 1
    assert m.table_slots == 64
    m.remove([3])  # its group has no empty slot: a tombstone, and the overflowed chunks stay reachable
    assert m._table.counts[DELETED_SLOTS] == 1
    for key, toks in enumerate(chunks[:10]):
        assert [r.storage_key for r in m.match(toks)] == ([] if key == 3 else [key])
    m.register(chunks[10], [10])  # reuses the tombstone
    assert m._table.counts[DELETED_SLOTS] == 0
    m.remove([9])  # in the next group, which has empty slots: emptied, no tombstone
    assert m._table.counts[DELETED_SLOTS] == 0
    for key in (0, 1, 2, 4, 5, 6, 7, 8, 10):
        toks = chunks[key]
        assert [r.storage_key for r in m.match(toks)] == [key]


def test_table_grows_under_load():
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 2**32, size=2 * 5000, dtype=np.uint32)
    m = TokenRangeMatcher(2, table_bits=3)
    assert m.register(tokens, np.arange(5000, dtype=np.uint64)) == 5000
    assert m.table_slots == 32768 and m.distinct_chunks == 5000  # >= 4 slots per live chunk
    got = m.match(tokens, align_tokens=2)
    assert [r.storage_key for r in got] == list(range(5000))
    assert all(r.cur_st == r.old_st for r in got)


def test_compact_ids_reused_past_2_pow_20():
    m = TokenRangeMatcher(1, table_bits=3)
    batch = 8192
    for b in range(2**20 // batch + 2):  # 1,064,960 registrations over time, at most 16,384 live
        keys = np.arange(b * batch, (b + 1) * batch, dtype=np.uint64)
        assert m.register(keys.astype(np.uint32), keys) == batch
        if b:
            assert m.remove((keys - batch).tolist()) == batch
    assert len(m) == batch and m.issued_ids <= 2 * batch
    assert m.table_slots <= 4 * 2 * batch  # tombstones are purged, the slots follow the peak of live chunks
    last = keys.astype(np.uint32)
    assert [r.storage_key for r in m.match(last[:5])] == keys[:5].tolist()
    assert m.match(np.arange(5, dtype=np.uint32)) == []  # the first batch is long gone


def test_evicting_older_copy_keeps_newer():
    m = TokenRangeMatcher(4)
    m.register([1, 2, 3, 4], [1])
    m.register([1, 2, 3, 4], [2])  # same content and position, another key
    m.remove([1])
    assert m.match([1, 2, 3, 4]) == [BlendMatch(0, 4, 0, 4, 2)]


def test_register_is_idempotent_by_key_and_start_chunk():
    m = TokenRangeMatcher(4)
    seq = list(range(1, 13))
    assert m.register(seq, [1, 2, 3], start_chunk=1) == 2
    assert 1 not in m
    assert m.register(seq, [1, 2, 3]) == 1  # only key 1 is new
    assert m.register(seq + [99, 98], [1, 2, 3]) == 0  # partial tail ignored, keys known
    assert m.register([9, 9, 9, 9, 8, 8, 8, 8], [5, 5]) == 1  # a key repeated in one call counts once
    assert len(m) == 4 and m.remove([5, 5, 77]) == 1


# --- bad input ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, field", [
    ({"chunk_size": 0}, "chunk_size"), ({"chunk_size": 2.0}, "chunk_size"), ({"table_bits": 2}, "table_bits"),
    ({"table_bits": 31}, "table_bits"), ({"base": -1}, "base"), ({"base": 2**64}, "base"),
    ({"dedup_content": 1}, "dedup_content"),
])
def test_bad_parameters(kwargs, field):
    with pytest.raises(ValueError, match=field):
        TokenRangeMatcher(**kwargs)


@pytest.mark.parametrize("tokens, keys, kwargs, message", [
    ([1, 2, 3, 4], [1, 2], {}, "storage_keys must hold one key per full chunk"),
    ([1, 2, 3, 4, 5, 6, 7, 8], [1], {}, "storage_keys must hold one key per full chunk"),
    ([1, -2, 3, 4], [1], {}, "token_ids .* got -2 at position 1"),
    ([1, 2, 2**32, 4], [1], {}, "token_ids .* got 4294967296 at position 2"),
    (np.array([1.0, 2.0, 3.0, 4.0]), [1], {}, "token_ids must be integers"),
    ([1, 2, 3.5, 4], [1], {}, "token_ids .* got 3.5 at position 2"),
    (np.zeros((1, 4), dtype=np.int64), [1], {}, "token_ids must be one-dimensional"),
    ([1, 2, 3, 4], [-1], {}, "storage_keys .* got -1"),
    ([1, 2, 3, 4], [2**64], {}, "storage_keys .* got 18446744073709551616"),
    ([1, 2, 3, 4], [1], {"start_chunk": 2}, "start_chunk"),
    ([1, 2, 3, 4], [1], {"start_chunk": -1}, "start_chunk"),
    ([1, 2, 3, 4], [1], {"position_offset": -4}, "position_offset"),
])
def test_bad_register_input(tokens, keys, kwargs, message):
    m = TokenRangeMatcher(4)
    with pytest.raises(ValueError, match=message):
        m.register(tokens, keys, **kwargs)
    assert len(m) == 0


def test_bad_match_and_remove_input():
    m = TokenRangeMatcher(4)
    m.register([1, 2, 3, 4], [1])
    with pytest.raises(ValueError, match="query_token_ids .* got -1"):
        m.match([1, 2, 3, -1])
    with pytest.raises(ValueError, match="align_tokens"):
        m.match([1, 2, 3, 4], align_tokens=0)
    with pytest.raises(ValueError, match="storage_keys"):
        m.remove([1, -5])
    assert len(m) == 1  # nothing removed by the refused call


# --- differential: the matcher against a plain-Python one ---------------------------------------

class NaiveMatcher:
    """Dictionary of live chunks: key -> (tokens, start); the rules of B10-B15 in a few plain lines."""

    def __init__(self, k: int, dedup: bool) -> None:
        self.k, self.dedup, self.live = k, dedup, {}

    def register(self, tokens: list[int], keys: list[int], start_chunk: int, offset: int) -> int:
        k, seen, n = self.k, set(), 0
        for j in range(start_chunk, len(tokens) // k):
            if keys[j] in self.live or keys[j] in seen:
                continue
            seen.add(keys[j])
            content = tuple(tokens[j * k:(j + 1) * k])
            if self.dedup and any(c == content for c, _ in self.live.values()):
                continue
            self.live[keys[j]] = (content, offset + j * k)
            n += 1
        return n

    def remove(self, keys: list[int]) -> int:
        return sum(self.live.pop(key, None) is not None for key in keys)

    def match(self, query: list[int], align: int) -> list[BlendMatch]:
        k, out, reported = self.k, [], set()
        for pos in range(0, len(query) - k + 1, align):
            window = tuple(query[pos:pos + k])
            copies = [(abs(st - pos), st, key) for key, (c, st) in self.live.items()
                      if c == window and key not in reported]
            if copies:
                _, st, key = min(copies)
                reported.add(key)
                out.append(BlendMatch(st, st + k, pos, pos + k, key))
        return out


tokens_small = st.lists(st.integers(0, 2), max_size=14)
ops = st.lists(st.one_of(
    st.tuples(st.just("register"), tokens_small, st.lists(st.integers(0, 12), min_size=14, max_size=14),
              st.integers(0, 8), st.integers(0, 20)),
    st.tuples(st.just("remove"), st.lists(st.integers(0, 12), max_size=4)),
    st.tuples(st.just("match"), tokens_small, st.integers(1, 3)),
), max_size=25)


class DegenerateBaseMatcher(TokenRangeMatcher):
    """Test-only: a matcher hashing with any base, 0 and 1 included (the public constructor requires base >= 2).

    Base 0 fingerprints a chunk by its last token, base 1 by its token sum: different chunks collide all the time,
    which is what the differential test needs to exercise the token comparison and the slot chains.
    """

    def __init__(self, k: int, *, base: int, table_bits: int, dedup_content: bool) -> None:
        super().__init__(k, table_bits=table_bits, dedup_content=dedup_content)
        self._base = np.uint64(base)


def test_degenerate_base_matcher_really_collides():
    for base, a, b in ((0, [1, 2, 9], [5, 7, 9]), (1, [1, 2, 9], [2, 1, 9])):
        assert kernels.chunk_hashes(np.array(a), 3, base)[0] == kernels.chunk_hashes(np.array(b), 3, base)[0]
        m = DegenerateBaseMatcher(3, base=base, table_bits=3, dedup_content=False)
        assert m.register(a + b, [1, 2]) == 2 and m.distinct_chunks == 2
        assert m.match(b + a) == [BlendMatch(3, 6, 0, 3, 2), BlendMatch(0, 3, 3, 6, 1)]
        assert int(m._table.fingerprint[0]) == int(kernels.chunk_hashes(np.array(a), 3, base)[0])


@settings(max_examples=250, deadline=None)
@given(k=st.integers(1, 3), dedup=st.booleans(), base=st.sampled_from([0, 1, 31, BLEND_BASE]), script=ops)
def test_matches_naive_matcher(k, dedup, base, script):
    """Tiny alphabet: many repeats, copies and (bases 0 and 1) fingerprint collisions between different chunks."""
    fast, naive = DegenerateBaseMatcher(k, base=base, table_bits=3, dedup_content=dedup), NaiveMatcher(k, dedup)
    for op in script:
        if op[0] == "register":
            _, tokens, keys, start_chunk, offset = op
            num_chunks = len(tokens) // k
            start_chunk = min(start_chunk, num_chunks)
            assert fast.register(tokens, keys[:num_chunks], start_chunk=start_chunk, position_offset=offset) == \
                naive.register(tokens, keys, start_chunk, offset)
        elif op[0] == "remove":
            assert fast.remove(op[1]) == naive.remove(op[1])
        else:
            assert fast.match(op[1], align_tokens=op[2]) == naive.match(op[1], op[2])
        assert len(fast) == len(naive.live)
        assert fast.distinct_chunks == len({c for c, _ in naive.live.values()})


def test_kernels_module_is_what_the_matcher_hashes_with():
    m = TokenRangeMatcher(4)
    m.register([5, 6, 7, 8], [1])
    assert int(m._table.fingerprint[0]) == int(kernels.chunk_hashes(np.array([5, 6, 7, 8]), 4)[0])


def test_the_notebook_walkthrough_step_by_step() -> None:
    """Notebook 08 §2: k = 4, base 31; stored `SYS A B` and `SYS 50 51 A 52 53`; the query
    `SYS C B 99 A 98 97 96` holds SYS as a prefix, B where it was stored and A shifted."""
    k, sys4, a, b, c = 4, [1, 2, 3, 4], list(range(10, 18)), list(range(20, 28)), list(range(30, 38))
    matcher = TokenRangeMatcher(k, base=31, table_bits=3)
    assert matcher.register(sys4 + a + b, [1, 2, 3, 4, 5]) == 5
    assert matcher.register(sys4 + [50, 51] + a + [52, 53], [6, 7, 8, 9]) == 4
    query = sys4 + c + b + [99] + a + [98, 97, 96]
    matches = matcher.match(query)
    # SYS at 0 (the nearer copy, key 1); B at 12 and 16 as stored; A's chunks at 21 and 25; a chunk of the
    # second prompt ([A2 A3 A4 A5], key 8) at 23, overlapping both
    assert [tuple(m) for m in matches] == [(0, 4, 0, 4, 1), (12, 16, 12, 16, 4), (16, 20, 16, 20, 5),
                                           (4, 8, 21, 25, 2), (8, 12, 23, 27, 8), (8, 12, 25, 29, 3)]
    prefix = prefix_run_tokens(matches)
    kept = leftmost_non_overlapping(matches, prefix)
    assert classes(matches) == ["prefix", "aligned", "aligned", "shifted", "shifted", "shifted"]
    assert prefix == 4 and [m.storage_key for m in kept] == [4, 5, 2, 3]  # the window at 23 is dropped
    assert unique_token_coverage(matches) == 20 and unique_token_coverage(kept) == 16
    split = prefill_savings(len(query), prefix, matches, min_blend_tokens=8)
    assert (split.prefix_hit_tokens, split.blended_tokens, split.recomputed_blend_tokens, split.fresh_tokens,
            split.saved_tokens) == (4, 16, 2, 12, 18)


def test_the_notebook_collisions() -> None:
    """Notebook 08: base 31, A's first chunk forged by -1/+31 keeps its fingerprint; a hash-only table
    (the older matcher) reports it, TokenRangeMatcher does not. With LMCache's base the shortest
    colliding deltas are a Fibonacci pair (F47 = 2,971,215,073)."""
    a = list(range(10, 18))
    forged = [a[0] - 1, a[1] + 31, a[2], a[3]]
    assert kernels.rolling_hashes(np.array(forged), 4, 31)[0] == chunk_hashes(np.array(a[:4]), 4, 31)[0]
    stored = [1, 2, 3, 4] + a + list(range(20, 28))
    hash_only = np.full(2**20, -1, dtype=np.int64)
    kernels.write_table(chunk_hashes(np.array(stored), 4, 31), hash_only, np.arange(5))
    assert kernels.unique_hits(kernels.rolling_hashes(np.array(forged), 4, 31), hash_only, 5).tolist() == [1]
    matcher = TokenRangeMatcher(4, base=31, table_bits=3)
    matcher.register(stored, [1, 2, 3, 4, 5])
    assert matcher.match(forged) == []
    assert tuple(abs(d) for d in shortest_collision(BLEND_BASE)) == (2_971_215_073, 50_920_843)
