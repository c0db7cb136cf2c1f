"""The numba tiered replay: T tiers, each a policy state, every write policy, promotion.

The fast counterpart of :meth:`kvlab.tiers.store.TieredStore.access_request` replayed
request by request (the readable reference and the tests' oracle): the same lookup walk
and order of touches, inserts, evictions, demotions and promotions, so the same hits,
residency and counters, exactly. A tier is the state of a :mod:`kvlab.policies` policy
that has the tier hooks (``touch``, ``insert``, ``evict``, ``remove``:
:mod:`kvlab.policies.base`); the driver decides, as :class:`~kvlab.tiers.tier.Tier` does,
when a tier must make room, and moves the victims. It is generic over the tiers' policies:
``states`` is a tuple of states and numba compiles one specialisation per tuple of state
types (a policy change compiles once, a capacity change does not). Block ids are the
trace's dense ids ``0 .. num_keys - 1``.

The driver keeps, besides the policies' states: ``where`` (``uint8[num_keys]``, bit ``t`` set
while the block is in tier ``t`` — write-through keeps a block in several — so the fastest
tier holding a block is one table lookup; at most :data:`MAX_TIERS` tiers), per tier its
capacity, whether it evicts (a tier of policy ``None`` never does: a block that does not
fit is not stored there), its resident blocks and its counters, and ``uses`` (saturating at
``selective_hits``) for ``write_through_selective``. A tier with capacity 0, or full and
never evicting, cannot take a block: under write-back a block spills past it to the next
tier that can.

The tuple is indexed by constants only (its states may differ in type): a hook of tier ``t``
is an if-chain over the tiers (:func:`tier_call`) calling that hook compiled for the tier's
state type, once per type. Per request the driver writes only the hit blocks per tier; the resident blocks per tier
are logged where they change (:func:`record_used`: once the tiers are full, seldom), and
:func:`request_columns` builds the frame's columns in one pass.
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import overload

from kvlab.core.jit import kernel_jit
from kvlab.policies.base import kernel_evict, kernel_insert, kernel_remove, kernel_touch

#: Write policy codes of the driver (index into :data:`kvlab.tiers.types.WRITE_POLICIES`).
WRITE_THROUGH, WRITE_BACK, WRITE_THROUGH_SELECTIVE = 0, 1, 2
#: At most this many tiers (the residency bitmap is ``uint8``).
MAX_TIERS = 8
#: Columns of the driver's counters (the :class:`~kvlab.tiers.tier.TierCounters` fields a replay changes).
COUNTERS = ("queried_blocks", "hit_blocks", "read_blocks", "written_blocks", "promoted_in_blocks",
            "demoted_in_blocks", "evicted_blocks", "demoted_out_blocks", "promoted_out_blocks")
QUERIED, HIT, READ, WRITTEN, PROMOTED_IN, DEMOTED_IN, EVICTED, DEMOTED_OUT, PROMOTED_OUT = range(len(COUNTERS))
#: The fastest tier holding a block, from its residency byte (bit t: in tier t); 8 for none.
_FIRST_TIER = np.array([(m & -m).bit_length() - 1 if m else MAX_TIERS for m in range(256)], dtype=np.int64)


# ---------------------------------------------------------------- one hook of tier t

#: Operations of :func:`tier_call`: the four tier hooks of :mod:`kvlab.policies.base`.
TOUCH, INSERT, EVICT, REMOVE = 0, 1, 2, 3


@kernel_jit(_nrt=False)
def hook_touch(state, block_id):  # noqa: ANN001, ANN201 - numba: any state with the tier hooks
    """The ``touch`` hook of ``state`` (returns 0)."""
    kernel_touch(state, block_id)
    return 0


@kernel_jit(_nrt=False)
def hook_insert(state, block_id):  # noqa: ANN001, ANN201
    """The ``insert`` hook of ``state`` (returns 0)."""
    kernel_insert(state, block_id)
    return 0


@kernel_jit(_nrt=False)
def hook_evict(state, block_id):  # noqa: ANN001, ANN201, ARG001
    """The ``evict`` hook of ``state``: the victim, ``-1`` if nothing is resident."""
    return kernel_evict(state)


@kernel_jit(_nrt=False)
def hook_remove(state, block_id):  # noqa: ANN001, ANN201
    """The ``remove`` hook of ``state``: 1 if the block was resident, else 0."""
    return 1 if kernel_remove(state, block_id) else 0


_HOOKS = (hook_touch, hook_insert, hook_evict, hook_remove)


def tier_call(states: tuple, t: int, op: int, block_id: int) -> int:
    """The tier hook ``op`` (a constant: :data:`TOUCH`, :data:`INSERT`, :data:`EVICT`,
    :data:`REMOVE`) of tier ``t``'s state, through :func:`hook_touch` ...: each is compiled
    once per state type (the policy's hook inlined) and reused by every tuple of tiers that
    holds that type; LLVM inlines them into the driver."""
    return _HOOKS[op](states[t], block_id)


@overload(tier_call, inline="always")
def _tier_call(states, t, op, block_id):  # noqa: ANN001, ANN202, ARG001 - numba typing signature
    # a tuple of states of different types is indexed by constants only: an if-chain over them
    if not isinstance(op, types.IntegerLiteral):
        return None
    lines = ["def impl(states, t, op, block_id):"]
    for i in range(len(states)):
        lines += [f"    {'if' if i == 0 else 'elif'} t == {i}:", f"        return hook(states[{i}], block_id)"]
    lines.append("    return -1")
    scope = {"hook": _HOOKS[op.literal_value]}
    exec("\n".join(lines), scope)  # noqa: S102 - generated from constants
    return scope["impl"]


# ---------------------------------------------------------------- the driver

@kernel_jit(_nrt=False)
def _can_accept(capacity: np.ndarray, evicts: np.ndarray, used: np.ndarray, u: int) -> bool:
    """Whether tier ``u`` can take a new block (:meth:`~kvlab.tiers.tier.Tier.can_accept`)."""
    return capacity[u] > 0 and (used[u] < capacity[u] or evicts[u])


@kernel_jit(_nrt=False)
def _lookup(block_ids: np.ndarray, a: int, n: int, where: np.ndarray, queried: np.ndarray, counters: np.ndarray,
            hits: np.ndarray, r: int) -> None:
    """The lookup walk of request ``r`` (blocks ``a .. a + n - 1``): ``hits[r, t]`` += the blocks
    tier ``t`` answers; ``queried`` is a difference array over the tiers (a tier first
    asked at block ``p`` is asked about ``n - p`` blocks: ``queried[lo] += n - p``,
    ``queried[hi + 1] -= n - p`` for the tiers ``lo .. hi`` first asked there)."""
    num_tiers = hits.shape[1]
    asked = 0  # tiers asked so far: 0 .. asked - 1
    for p in range(n):
        w = _FIRST_TIER[where[block_ids[a + p]]]
        deepest = min(w, num_tiers - 1) + 1
        if deepest > asked:
            queried[asked] += n - p
            queried[deepest] -= n - p
            asked = deepest
        if w >= num_tiers:
            break
        hits[r, w] += 1
        counters[w, HIT] += 1


@kernel_jit(_nrt=False)
def record_used(used: np.ndarray, used_log: np.ndarray, m: int, r: int) -> int:
    """Log the resident blocks per tier after request ``r`` if they differ from the last
    logged (rows ``0 .. m - 1`` of ``used_log``: the request, then one column per tier);
    returns the rows logged. They change seldom once the tiers are full, so the log stays
    short (and a preallocated ``np.empty`` log is never touched beyond it)."""
    num_tiers = used.shape[0]
    changed = m == 0
    t = 0
    while not changed and t < num_tiers:
        changed = used_log[m - 1, t + 1] != used[t]
        t += 1
    if changed:
        used_log[m, 0] = r
        for t in range(num_tiers):
            used_log[m, t + 1] = used[t]
        m += 1
    return m


@kernel_jit(nogil=True, _nrt=False)
def tiered_replay_range(offsets: np.ndarray, block_ids: np.ndarray, start: int, stop: int, reverse: bool,
                        write_policy: int, promote: bool, selective_hits: int, states: tuple, where: np.ndarray,
                        capacity: np.ndarray, evicts: np.ndarray, used: np.ndarray, uses: np.ndarray,
                        counters: np.ndarray, hit_blocks: np.ndarray, used_log: np.ndarray,
                        num_logged: np.ndarray, queried: np.ndarray) -> None:
    """Replay requests ``start .. stop - 1`` (``offsets``: ``int64`` CSR, ``block_ids``:
    ``int32`` dense ids) through the tiers (mutated; they carry over between calls).

    Per request: the lookup (the combined contiguous prefix, each block answered by the
    fastest tier holding it), then every block accessed — from the tail to the head when
    ``reverse`` (``touch_order="head_most_recent"``) — served from the fastest tier holding
    it now or, resident nowhere, stored.

    Args:
        write_policy: :data:`WRITE_THROUGH`, :data:`WRITE_BACK` or :data:`WRITE_THROUGH_SELECTIVE`.
        promote: copy (write-through) or move (write-back) a lower-tier hit up.
        selective_hits: uses before ``write_through_selective`` copies a block down.
        states: one policy state per tier, fastest first, each with the tier hooks and a
            capacity of ``capacity[t]`` blocks.
        where: ``uint8[num_keys]`` residency bitmap; ``capacity``, ``used``: ``int64[T]``
            blocks (an unbounded tier has ``num_keys``); ``evicts``: ``bool[T]``;
            ``uses``: ``int32[num_keys]``; ``counters``: ``int64[T, len(COUNTERS)]``.
        hit_blocks: ``[num_requests, T]`` (zeroed, any integer type holding a request's
            length): the blocks each tier answered.
        used_log, num_logged: the resident blocks per tier logged where they change
            (``[num_requests, T + 1]``; ``num_logged[0]`` rows, carried over between calls;
            see :func:`record_used`).
        queried: scratch, ``int64[T + 1]``.

    Compiled without numba's reference counting (``_nrt=False``: it allocates nothing),
    which would otherwise count the references to a state's arrays at every hook call
    (measured: 4× slower with two LRU tiers).
    """
    num_tiers = capacity.shape[0]
    write_back = write_policy == WRITE_BACK
    selective = write_policy == WRITE_THROUGH_SELECTIVE
    queried[:] = 0
    logged = num_logged[0]
    dirty = True  # the resident blocks per tier may differ from the last logged
    for r in range(start, stop):
        a = offsets[r]
        n = offsets[r + 1] - a
        _lookup(block_ids, a, n, where, queried, counters, hit_blocks, r)
        for j in range(n):  # access every block in touch order
            k = block_ids[a + n - 1 - j] if reverse else block_ids[a + j]
            if selective and uses[k] < selective_hits:
                uses[k] += 1
            copy_down = selective and uses[k] >= selective_hits
            t = _FIRST_TIER[where[k]]
            # the inserts this access makes: tiers down_from, down_from - 1, ... (n_down of
            # them, promoted in), then the tiers up_from .. up_to - 1 that lack the block
            n_down = 0
            down_from = 0
            up_from = 0
            up_to = 0
            if t < num_tiers:  # served from tier t
                counters[t, READ] += 1
                up = t  # exclusive promotion: to the first tier above that can take it
                if write_back and promote:
                    up = 0
                    while up < t and not _can_accept(capacity, evicts, used, up):
                        up += 1
                if up < t:  # move it up
                    tier_call(states, t, REMOVE, k)
                    where[k] &= ~np.uint8(1 << t)
                    used[t] -= 1
                    dirty = True
                    counters[t, PROMOTED_OUT] += 1
                    n_down = 1
                    down_from = up
                else:  # touch (in place, or no tier above can take it)
                    tier_call(states, t, TOUCH, k)
                    if promote and not write_back:  # copy into every tier above
                        n_down = t
                        down_from = t - 1
                    if copy_down:  # copy down to every lower tier
                        up_from = 1
                        up_to = num_tiers
                    if n_down == 0 and up_to == 0:
                        continue
            else:  # computed: store per the write policy
                up_to = num_tiers if write_policy == WRITE_THROUGH or copy_down else 1
            for step in range(n_down + up_to - up_from):
                if step < n_down:
                    u = down_from - step
                    promoted = True
                else:
                    u = up_from + step - n_down
                    promoted = False
                    if where[k] >> u & 1:
                        continue
                while write_back and u + 1 < num_tiers and not _can_accept(capacity, evicts, used, u):
                    u += 1  # does not fit: the next tier
                if not _can_accept(capacity, evicts, used, u):
                    continue
                block = k
                while True:  # insert block into u: evict first, then, under write-back, demote the victim
                    victim = -1
                    if used[u] >= capacity[u]:
                        victim = tier_call(states, u, EVICT, -1)
                        where[victim] &= ~np.uint8(1 << u)
                        counters[u, EVICTED] += 1
                    else:
                        used[u] += 1
                        dirty = True
                    tier_call(states, u, INSERT, block)
                    where[block] |= np.uint8(1 << u)
                    counters[u, WRITTEN] += 1
                    if promoted:
                        counters[u, PROMOTED_IN] += 1
                        promoted = False
                    if victim < 0 or not write_back:
                        break  # nothing evicted, or the victim is dropped
                    w = u + 1
                    while w < num_tiers and not _can_accept(capacity, evicts, used, w):
                        w += 1  # the victim skips tiers that cannot take it
                    if w >= num_tiers:
                        break  # no tier below: dropped
                    counters[u, DEMOTED_OUT] += 1
                    counters[w, DEMOTED_IN] += 1
                    block = victim
                    u = w
        if dirty:
            logged = record_used(used, used_log, logged, r)
            dirty = False
    num_logged[0] = logged
    total = 0
    for t in range(num_tiers):  # fold the difference array
        total += queried[t]
        counters[t, QUERIED] += total


@kernel_jit(nogil=True)
def max_request_blocks(offsets: np.ndarray) -> int:
    """The longest request's blocks (0 if none), from the CSR ``offsets``."""
    longest = 0
    for r in range(offsets.shape[0] - 1):
        longest = max(longest, offsets[r + 1] - offsets[r])
    return longest


@kernel_jit(nogil=True)
def request_columns(offsets: np.ndarray, input_tokens: np.ndarray, block_size: int, skip: int,
                    hit_blocks: np.ndarray, used_log: np.ndarray, hits: np.ndarray, used: np.ndarray,
                    total: np.ndarray, hit_tokens: np.ndarray, computed: np.ndarray,
                    tier_hits: np.ndarray) -> tuple[int, int, int]:
    """The per-request columns of a replay in one pass, into ``hits`` and ``used``
    (``uint32[T, num_requests]``, tier by tier: hit blocks, and resident blocks after the
    request expanded from ``used_log``), ``total``, ``hit_tokens`` and ``computed``
    (``uint32[num_requests]``: hit blocks over the tiers, their tokens — full blocks as
    ``block_size`` tokens, at most the input — and the blocks computed) — numpy's arrays:
    it asks the kernel for huge pages, which a 10 M-request frame faults in much faster —
    and over the requests from ``skip`` on: hit blocks per tier (into ``tier_hits``,
    ``int64[T]``, zeroed), and returned, hit blocks, hit tokens and input tokens."""
    n, num_tiers = hit_blocks.shape
    hit_sum = 0
    hit_token_sum = 0
    num_inputs = 0
    row = 0
    for r in range(n):
        while row + 1 < used_log.shape[0] and used_log[row + 1, 0] <= r:
            row += 1
        h = 0
        for t in range(num_tiers):
            x = hit_blocks[r, t]
            hits[t, r] = x
            h += x
            used[t, r] = used_log[row, t + 1]
        total[r] = h
        inp = np.int64(input_tokens[r])
        tokens = min(h * block_size, inp)
        hit_tokens[r] = tokens
        computed[r] = offsets[r + 1] - offsets[r] - h
        if r >= skip:
            for t in range(num_tiers):
                tier_hits[t] += hit_blocks[r, t]
            hit_sum += h
            hit_token_sum += tokens
            num_inputs += inp
    return hit_sum, hit_token_sum, num_inputs
