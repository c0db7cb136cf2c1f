"""The bit tree of :mod:`kvlab.policies.structs` against a Python set."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from kvlab.policies.structs import bit_tree_add, bit_tree_max, bit_tree_remove, bit_tree_remove_max, make_bit_tree

#: ``ops`` of :func:`set_operations` removing the largest member.
POP = -(2**62)


@njit
def _run(bits, levels, ops, out, popped):  # noqa: ANN001, ANN202 - op >= 0 adds it, POP pops, else removes ~op
    for t in range(ops.shape[0]):
        if ops[t] >= 0:
            bit_tree_add(bits, levels, ops[t])
        elif ops[t] == POP:
            popped[t] = bit_tree_remove_max(bits, levels, bit_tree_max(bits, levels))
        else:
            bit_tree_remove(bits, levels, ~ops[t])
        out[t] = bit_tree_max(bits, levels)


@st.composite
def set_operations(draw: st.DrawFn) -> tuple[int, list[int]]:
    """A universe size and adds/removes (``~j`` removes ``j``, :data:`POP` the largest) that
    keep the set a set."""
    n = draw(st.sampled_from([1, 63, 64, 65, 4095, 4096, 4097, 262_145, 300_000]))
    members: set[int] = set()
    ops = []
    for _ in range(draw(st.integers(1, 60))):
        if members and draw(st.booleans()):
            if draw(st.booleans()):
                members.discard(max(members))
                ops.append(POP)
                continue
            j = draw(st.sampled_from(sorted(members)))
            members.discard(j)
            ops.append(~j)
        else:
            j = draw(st.one_of(st.integers(0, n - 1), st.sampled_from([0, n - 1])))
            if j not in members:
                members.add(j)
                ops.append(j)
    return n, ops


def test_bit_tree_levels() -> None:
    assert [make_bit_tree(n)[1].tolist() for n in (0, 64, 65, 4096, 4097)] == [[0], [0], [0, 2], [0, 64],
                                                                                 [0, 65, 67]]
    assert make_bit_tree(262_145)[0].shape == (4097 + 65 + 2 + 1,)


@settings(deadline=None)
@given(case=set_operations())
def test_bit_tree_max_equals_the_largest_member(case) -> None:
    n, ops = case
    bits, levels = make_bit_tree(n)
    out, popped = np.empty(len(ops), dtype=np.int64), np.full(len(ops), -2, dtype=np.int64)
    _run(bits, levels, np.array(ops, dtype=np.int64), out, popped)
    members: set[int] = set()
    expected = []
    for op in ops:
        if op == POP:
            members.discard(max(members))
        elif op >= 0:
            members.add(op)
        else:
            members.discard(~op)
        expected.append(max(members, default=-1))
    assert out.tolist() == expected
    assert [p for p, op in zip(popped.tolist(), ops) if op == POP] == [e for e, op in zip(expected, ops) if op == POP]
    if not members:
        assert not bits.any()  # every level is cleared back to zero
