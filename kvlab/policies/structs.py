"""The data structures the numba kernels share: an intrusive doubly linked list, an indexed
binary heap over dense ids, and a bit tree over positions.

**Lists.** Two arrays ``prev`` and ``next`` (any integer dtype) link entries by index; a list
is headed by a *sentinel* entry, circular: ``next[sentinel]`` is the first (oldest, least
recent) entry, ``prev[sentinel]`` the last (newest, most recent); an empty list's sentinel
links to itself. Several lists can share one pair of arrays (S3-FIFO's three queues, ARC's
four lists), each with its own sentinel (:func:`make_lists` puts them after the ``n``
entries). Every operation is O(1) and never checks membership: unlinking an entry that is
not on a list corrupts the lists. vLLM v1's ``FreeKVCacheBlockQueue`` is the same structure.

**One list in one array.** A policy with a single list (LRU) keeps it in one contiguous
interleaved array ``links`` (``links[2 * k]`` = prev of ``k``, ``links[2 * k + 1]`` = next),
indexed with unsigned integers: numba then emits neither a stride multiplication (the
``prev``/``next`` views of :func:`make_lists` are strided) nor a negative-index wrap-around
per access, which made LRU's replay 1.2–1.5× faster (``benchmarks/README.md``). Same rules
as above; :func:`links_unlink` and :func:`links_push_back` are the two operations.

**Heaps.** ``heap`` holds ids in slots ``0 .. size - 1`` (a binary heap: the root, slot 0,
is the first in the order), ``slot[id]`` is an id's slot (the caller keeps ``-1`` for ids
not in the heap, when it needs to know), and ``less(data, a, b)`` — a numba function
passed as an argument, with ``data`` whatever it reads (an array or a tuple of arrays) —
says whether id ``a`` comes before id ``b``. Numba compiles one specialisation per
``less``, so a min-heap, a max-heap and a lexicographic order share the code.

**Bit trees.** A set of integers ``0 .. n - 1`` (Belady's next uses, flat reference
positions) as a 64-ary tree of ``int64`` bit words, all levels in one array ``bits`` with
``levels[l]`` the offset of level ``l``: level 0 has bit ``j`` for member ``j``, and bit ``w``
of level ``l + 1`` says word ``w`` of level ``l`` is not zero; the top level is one word.
Adding, removing and finding (or removing) the largest member touch one word per level (4 levels up to
16.7 M positions, 5 up to 1.07 G): ``n / 8`` bytes plus 1.6 %, a 32nd of an ``int32`` per
position.

The functions are compiled inline into each kernel (``inline="always"``), so a kernel
written with them is the kernel written by hand.

Example:
    >>> import numpy as np
    >>> prev, nxt = make_lists(4, 1)          # ids 0..3, one list headed by sentinel 4
    >>> for k in (2, 0, 3):
    ...     list_push_back(prev, nxt, 4, k)
    >>> list_unlink(prev, nxt, 0)
    >>> int(list_pop_front(prev, nxt, 4)), int(nxt[4]), int(prev[4])
    (2, 3, 3)
    >>> bits, levels = make_bit_tree(4000)     # members 0..3999: 63 words, then the top word
    >>> for j in (7, 3999, 64):
    ...     bit_tree_add(bits, levels, j)
    >>> bit_tree_remove(bits, levels, 3999)
    >>> int(bit_tree_max(bits, levels)), levels.tolist()
    (64, [0, 63])
"""

from __future__ import annotations

import numpy as np
from numba.cpython.unsafe.numbers import leading_zeros

from kvlab.core.jit import kernel_jit


def make_lists(n: int, num_lists: int, dtype: type = np.int32) -> tuple[np.ndarray, np.ndarray]:
    """``prev``, ``next`` (``dtype[n + num_lists]``, the even and odd halves of one
    interleaved array, so an entry's links share a cache line) for entries ``0 .. n - 1`` and ``num_lists``
    empty lists whose sentinels are ``n .. n + num_lists - 1`` (each linked to itself; the
    entries' links are unset until pushed: they hold ``n``)."""
    links = np.full(2 * (n + num_lists), n, dtype=dtype)  # interleaved: an entry's two links share a cache line
    prev, nxt = links[0::2], links[1::2]
    prev[n:] = nxt[n:] = np.arange(n, n + num_lists, dtype=dtype)
    return prev, nxt


@kernel_jit(inline="always")
def list_unlink(prev, nxt, k):  # noqa: ANN001, ANN201 - numba helper
    """Take entry ``k`` out of the list it is on (its own links are left stale)."""
    p = prev[k]
    q = nxt[k]
    nxt[p] = q
    prev[q] = p


@kernel_jit(inline="always")
def list_insert_after(prev, nxt, at, k):  # noqa: ANN001, ANN201
    """Link entry ``k`` right after entry (or sentinel) ``at``."""
    q = nxt[at]
    nxt[at] = k
    prev[k] = at
    nxt[k] = q
    prev[q] = k


@kernel_jit(inline="always")
def list_push_back(prev, nxt, sentinel, k):  # noqa: ANN001, ANN201
    """Append entry ``k`` as the last (newest) of the list headed by ``sentinel``."""
    last = prev[sentinel]
    nxt[last] = k
    prev[k] = last
    nxt[k] = sentinel
    prev[sentinel] = k


@kernel_jit(inline="always")
def list_pop_front(prev, nxt, sentinel):  # noqa: ANN001, ANN201
    """Unlink and return the first (oldest) entry of a non-empty list."""
    k = nxt[sentinel]
    q = nxt[k]
    nxt[sentinel] = q
    prev[q] = sentinel
    return k


@kernel_jit(inline="always")
def links_unlink(links, k):  # noqa: ANN001, ANN201
    """Take entry ``k`` out of the list of the interleaved ``links`` (its own links are left
    stale); returns its successor (an entry or the sentinel)."""
    p = np.int64(links[np.uint64(2 * k)])
    q = np.int64(links[np.uint64(2 * k + 1)])
    links[np.uint64(2 * p + 1)] = q
    links[np.uint64(2 * q)] = p
    return q


@kernel_jit(inline="always")
def links_push_back(links, sentinel, k):  # noqa: ANN001, ANN201
    """Append entry ``k`` as the last (newest) of the list of the interleaved ``links``
    headed by ``sentinel``."""
    last = np.int64(links[np.uint64(2 * sentinel)])
    links[np.uint64(2 * last + 1)] = k
    links[np.uint64(2 * k)] = last
    links[np.uint64(2 * k + 1)] = sentinel
    links[np.uint64(2 * sentinel)] = k


@kernel_jit(inline="always")
def heap_sift(heap, slot, i, size, less, data):  # noqa: ANN001, ANN201
    """Restore the heap order around slot ``i`` (its id moved either way): sift it up past
    every parent it comes before, then down past every child that comes before it (the
    earlier child first); ``slot`` follows every id moved."""
    k = heap[i]
    while i > 0 and less(data, k, heap[(i - 1) // 2]):  # up
        heap[i] = heap[(i - 1) // 2]
        slot[heap[i]] = i
        i = (i - 1) // 2
    while 2 * i + 1 < size:  # down
        child = 2 * i + 1
        if child + 1 < size and less(data, heap[child + 1], heap[child]):
            child += 1
        if not less(data, heap[child], k):
            break
        heap[i] = heap[child]
        slot[heap[i]] = i
        i = child
    heap[i] = k
    slot[k] = i


@kernel_jit(inline="always")
def heap_push(heap, slot, k, size, less, data):  # noqa: ANN001, ANN201
    """Add id ``k`` to a heap of ``size`` ids (``heap`` has room); returns the new size."""
    heap[size] = k
    heap_sift(heap, slot, size, size + 1, less, data)
    return size + 1


@kernel_jit(inline="always")
def heap_remove(heap, slot, i, size, less, data):  # noqa: ANN001, ANN201
    """Remove the id in slot ``i`` (``slot`` of it becomes ``-1``; the last id fills the
    hole); returns the new size."""
    slot[heap[i]] = -1
    size -= 1
    if i < size:
        heap[i] = heap[size]
        heap_sift(heap, slot, i, size, less, data)
    return size


def make_bit_tree(n: int) -> tuple[np.ndarray, np.ndarray]:
    """An empty bit tree for members ``0 .. n - 1`` (``n >= 0``): ``bits`` (``int64``, all
    levels, zero) and ``levels`` (``int64[num_levels]``, each level's first word in ``bits``;
    level 0 has ``ceil(n / 64)`` words, at least one, and the top level one)."""
    offsets, total, words = [], 0, max(-(-n // 64), 1)
    while True:
        offsets.append(total)
        total += words
        if words == 1:
            return np.zeros(total, dtype=np.int64), np.array(offsets, dtype=np.int64)
        words = -(-words // 64)


@kernel_jit(inline="always")
def bit_tree_add(bits, levels, j):  # noqa: ANN001, ANN201
    """Add member ``j`` (setting its bit in each level up to the first word that was not zero)."""
    for lev in range(levels.shape[0]):
        o = levels[lev] + (j >> 6)
        word = bits[o]
        bits[o] = word | (np.int64(1) << (j & 63))
        if word != 0:
            return
        j >>= 6


@kernel_jit(inline="always")
def bit_tree_remove(bits, levels, j):  # noqa: ANN001, ANN201
    """Remove member ``j`` (clearing its bit in each level up to the first word left not zero)."""
    for lev in range(levels.shape[0]):
        o = levels[lev] + (j >> 6)
        word = bits[o] & ~(np.int64(1) << (j & 63))
        bits[o] = word
        if word != 0:
            return
        j >>= 6


@kernel_jit(inline="always")
def bit_tree_max(bits, levels):  # noqa: ANN001, ANN201
    """The largest member, ``-1`` if the tree is empty: from the top word down, the highest bit."""
    w = 0
    for lev in range(levels.shape[0] - 1, -1, -1):
        word = bits[levels[lev] + w]
        if word == 0:
            return -1
        w = (w << 6) + 63 - leading_zeros(word)
    return w


@kernel_jit(inline="always")
def bit_tree_remove_max(bits, levels, j):  # noqa: ANN001, ANN201
    """Remove the largest member ``j`` and return the new largest (``-1`` if none): the
    search starts at the lowest word left not zero by the removal, which holds it."""
    lev = 0
    while lev < levels.shape[0]:
        o = levels[lev] + (j >> 6)
        word = bits[o] & ~(np.int64(1) << (j & 63))
        bits[o] = word
        if word != 0:
            w = ((j >> 6) << 6) + 63 - leading_zeros(word)
            while lev > 0:
                lev -= 1
                w = (w << 6) + 63 - leading_zeros(bits[levels[lev] + w])
            return w
        j >>= 6
        lev += 1
    return -1
