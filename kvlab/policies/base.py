"""The contract every eviction policy plug-in fulfils.

A policy is two things that must agree exactly:

* a **reference class**: readable Python, one object per cache, implementing
  :class:`ReferencePolicy` (``key in cache``, ``cache.access(key, ref_index)``,
  ``len(cache)``, ``cache.remove(key)``, ``cache.evict()``) — the oracle the tests compare
  against; a tier (:class:`kvlab.tiers.Tier`) enforces its capacity itself with ``evict()``
  and moves blocks out with ``remove(key)``;
* **kernel hooks** for the numba replays: a ``NamedTuple`` of numpy arrays holding the
  state, and small functions registered with :func:`register_kernel`.

The single-cache replay (:mod:`kvlab.sim.kernel`) uses three hooks:

============  ===========================================================  ====================
hook          signature                                                     does
============  ===========================================================  ====================
``contains``  ``(state, block_id) -> bool``                                 is it resident?
``access``    ``(state, block_ids, start, stop, reverse, evicted) -> int``  one request: touch
                                                                            or insert each of
                                                                            ``block_ids[start:
                                                                            stop]`` (from
                                                                            ``stop - 1`` down
                                                                            when ``reverse``),
                                                                            evicting as needed;
                                                                            writes the victims'
                                                                            ids to ``evicted``
                                                                            in order; returns
                                                                            their number
``used``      ``(state) -> int`` (default: ``counters[0]``)                 resident blocks
============  ===========================================================  ====================

With ``hit_semantics="independent"`` and no orphan tracking, the driver hands the whole
request range to one more hook, ``replay_independent(state, offsets, block_ids, start, stop,
reverse, evicted, hit_blocks, used_blocks, evictions) -> None``: for each request ``r`` of
``start .. stop - 1``, each of its blocks in touch order looked up and then accessed on its
own, ``hit_blocks[r]`` = blocks resident at their lookup, ``evictions[r]`` = blocks evicted,
``used_blocks[r]`` = resident blocks after it. The default (:func:`replay_each_block`) is
``contains`` then a one-block ``access`` per block (:func:`each_block`); a policy whose
``access`` does the lookup anyway (LRU) registers its own loop, which keeps its state in
registers across requests instead of reloading it per block.

The tiered replay (:mod:`kvlab.tiers.driver`), where the tier and not the policy decides when
to evict, uses four more — the numba counterparts of the reference's ``access`` on a resident
block, ``access`` of a new block into a cache that is not full, ``evict()`` and ``remove()``:

============  ===========================================================  ====================
hook          signature                                                     does
============  ===========================================================  ====================
``touch``     ``(state, block_id) -> None``                                 a hit on a resident
                                                                            block
``insert``    ``(state, block_id) -> None``                                 insert a block that
                                                                            is not resident
                                                                            into a cache with
                                                                            room (no eviction)
``evict``     ``(state) -> int``                                            choose and remove a
                                                                            victim, as for a new
                                                                            block; ``-1`` if
                                                                            nothing is resident
``remove``    ``(state, block_id) -> bool``                                 drop a block without
                                                                            an eviction; ``False``
                                                                            if not resident
============  ===========================================================  ====================

A policy whose reference reads the whole trace (``reference_uses_trace``) cannot run in a
tier and registers none of the four.

The drivers call :func:`kernel_contains`, :func:`kernel_access`, :func:`kernel_used`,
:func:`kernel_touch`, :func:`kernel_insert`, :func:`kernel_evict` and :func:`kernel_remove`;
numba picks the policy's hook from the type of ``state``, so adding a policy never touches the
drivers or their callers. The hooks are inlined at numba's IR level
(``overload(..., inline="always")``), and the drivers are compiled without numba's reference
counting (``_nrt=False``), which would otherwise count the references to a state's arrays at
every hook call and in every helper with branches (``benchmarks/README.md`` gives the measured
costs): a hook must not allocate. ``access`` takes a whole request, not one block, to keep the
driver's call per request. Inside a hook, bind the state's arrays to locals once and loop over
the blocks; :mod:`kvlab.policies.structs` holds the list and heap every kernel shares. The
flat index ``i`` of a block in ``block_ids`` is its reference index (policies that look ahead,
such as Belady, precompute per-reference arrays in ``make_state``). ``evicted`` has room for
``stop - start`` ids: a policy evicts at most one resident block per block it inserts (its
capacity is fixed), and must never write more — numba does not check bounds. A state is driven
either by ``access`` (a replay) or by the tier hooks (a tier), never by both.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np
from numba import types
from numba.core.errors import NumbaIRAssumptionWarning
from numba.extending import overload

from kvlab.core.jit import kernel_jit
from kvlab.traces.flat import FlatTrace


class ReferencePolicy(Protocol):
    """Readable reference cache of one policy (the oracle for the numba kernel)."""

    capacity_blocks: int | None

    def __contains__(self, block_id: int) -> bool:
        """Whether ``block_id`` is resident (no side effect)."""
        ...

    def access(self, block_id: int, ref_index: int) -> list[int]:
        """Touch a resident block or insert a missing one; return the evicted block ids."""
        ...

    def __len__(self) -> int:
        """Number of resident blocks."""
        ...

    def remove(self, block_id: int) -> bool:
        """Drop a resident block without counting it as an eviction (promoted to another
        tier, invalidated, pinned): it enters no ghost or history list. Returns ``False``,
        changing nothing, if it was not resident. Each policy documents what becomes of
        its metadata."""
        ...

    def evict(self) -> int | None:
        """Choose and remove one resident block, exactly as the policy would to make room
        for inserting a block it knows nothing of (not resident, in no ghost list); return
        it, or ``None`` if nothing is resident. On a full cache, ``evict()`` equals the
        first victim of ``access(new_key, i)``, internal steps (reinsertions, ghost
        entries) included."""
        ...


@dataclass(frozen=True)
class PolicySpec:
    """A registered eviction policy.

    Attributes:
        name: registry name (``"lru"``).
        summary: one line: what it evicts.
        models: the system or paper it models.
        reference: ``capacity_blocks -> ReferencePolicy`` (``None`` = unbounded); when
            ``reference_uses_trace``, called as ``reference(capacity_blocks,
            requests=block_keys_per_request)`` (positions, parents, next uses).
        make_state: ``(flat_trace, capacity_blocks) -> NamedTuple`` of numpy arrays for
            the kernel hooks (``capacity_blocks`` is an int here; the caller maps
            "unbounded" to ``flat_trace.num_keys``).
        reference_uses_trace: the reference class needs the whole trace (a policy that
            reads per-reference facts such as a block's position or next use).
    """

    name: str
    summary: str
    models: str
    reference: Callable[..., ReferencePolicy]
    make_state: Callable[[FlatTrace, int], NamedTuple]
    reference_uses_trace: bool = False


# Inlining the hooks makes numba's pedantic SSA check report variables of the inlined body
# as out of scope; the check is informational (the compiled code is unaffected, and the
# kernels are tested against the reference classes), so its noise is silenced here (it is
# attributed to the driver's module or to numba's).
warnings.filterwarnings("ignore", category=NumbaIRAssumptionWarning)

class KernelHooks(NamedTuple):
    """A policy's registered kernel hooks (see the module docstring); the four tier hooks
    are ``None`` for a policy that cannot run in a tier."""

    contains: Callable[..., bool]
    access: Callable[..., int]
    used: Callable[..., int]
    replay_independent: Callable[..., None]
    touch: Callable[..., None] | None = None
    insert: Callable[..., None] | None = None
    evict: Callable[..., int] | None = None
    remove: Callable[..., bool] | None = None


_HOOKS: dict[type, KernelHooks] = {}


def kernel_contains(state: NamedTuple, block_id: int) -> bool:
    """Generic hook: is ``block_id`` resident? (dispatches on the state's type)."""
    return _HOOKS[type(state)].contains(state, block_id)


def kernel_access(state: NamedTuple, block_ids: np.ndarray, start: int, stop: int, reverse: bool,
                  evicted: np.ndarray) -> int:
    """Generic hook: touch or insert one request's blocks; victims go to ``evicted``;
    returns their number."""
    return _HOOKS[type(state)].access(state, block_ids, start, stop, reverse, evicted)


def kernel_replay_independent(state: NamedTuple, offsets: np.ndarray, block_ids: np.ndarray, start: int, stop: int,
                              reverse: bool, evicted: np.ndarray, hit_blocks: np.ndarray, used_blocks: np.ndarray,
                              evictions: np.ndarray) -> None:
    """Generic hook: replay requests ``start .. stop - 1`` with independent lookups, writing
    their ``hit_blocks``, ``used_blocks`` and ``evictions`` (see the module docstring)."""
    _HOOKS[type(state)].replay_independent(state, offsets, block_ids, start, stop, reverse, evicted, hit_blocks,
                                           used_blocks, evictions)


@kernel_jit(inline="always")
def each_block(state, block_ids, start, stop, reverse, evicted):  # noqa: ANN001, ANN201 - numba helper
    """One request with independent lookups through the generic hooks: ``contains``, then a
    one-block ``access``, per block in touch order (from ``stop - 1`` down when
    ``reverse``); returns (blocks resident at their lookup, blocks evicted)."""
    hits = 0
    num_evicted = 0
    for j in range(stop - start):
        i = stop - 1 - j if reverse else start + j
        if kernel_contains(state, block_ids[i]):
            hits += 1
        num_evicted += kernel_access(state, block_ids, i, i + 1, False, evicted[num_evicted:])
    return hits, num_evicted


def replay_each_block(state, offsets, block_ids, start, stop, reverse, evicted, hit_blocks, used_blocks,  # noqa: ANN001, ANN201, PLR0913
                      evictions):  # noqa: ANN001 - numba hook
    """The default ``replay_independent`` hook: :func:`each_block` per request."""
    for r in range(start, stop):
        h, ev = each_block(state, block_ids, offsets[r], offsets[r + 1], reverse, evicted)
        hit_blocks[r] = h
        evictions[r] = ev
        used_blocks[r] = kernel_used(state)


def kernel_used(state: NamedTuple) -> int:
    """Generic hook: number of resident blocks."""
    return _HOOKS[type(state)].used(state)


def kernel_touch(state: NamedTuple, block_id: int) -> None:
    """Generic tier hook: a hit on the resident block ``block_id``."""
    _HOOKS[type(state)].touch(state, block_id)


def kernel_insert(state: NamedTuple, block_id: int) -> None:
    """Generic tier hook: insert ``block_id`` (not resident) into a cache with room."""
    _HOOKS[type(state)].insert(state, block_id)


def kernel_evict(state: NamedTuple) -> int:
    """Generic tier hook: evict the policy's victim and return it (``-1``: nothing resident)."""
    return _HOOKS[type(state)].evict(state)


def kernel_remove(state: NamedTuple, block_id: int) -> bool:
    """Generic tier hook: drop ``block_id`` without an eviction; ``False`` if not resident."""
    return _HOOKS[type(state)].remove(state, block_id)


def has_tier_hooks(state: NamedTuple) -> bool:
    """Whether the policy of ``state`` registered the four tier hooks.

    Example:
        >>> from kvlab.policies import get_policy
        >>> from kvlab.traces.flat import flatten_block_keys
        >>> import polars as pl
        >>> flat = flatten_block_keys(pl.Series([[1, 2]]), pl.Series([2]), block_size=1)
        >>> lru, belady = get_policy("lru"), get_policy("belady")
        >>> has_tier_hooks(lru.make_state(flat, 1)), has_tier_hooks(belady.make_state(flat, 1))
        (True, False)
    """
    hooks = _HOOKS.get(type(state))
    return hooks is not None and hooks.touch is not None


def counters_used(state):  # noqa: ANN001, ANN201 - numba hook
    """The default ``used`` hook: a state whose ``counters[0]`` is its resident blocks."""
    return state.counters[0]


def register_kernel(state_class: type, *, contains: Callable[..., bool], access: Callable[..., int],
                    used: Callable[..., int] = counters_used,
                    replay_independent: Callable[..., None] = replay_each_block,
                    touch: Callable[..., None] | None = None,
                    insert: Callable[..., None] | None = None, evict: Callable[..., int] | None = None,
                    remove: Callable[..., bool] | None = None) -> None:
    """Register a policy's kernel hooks for its state ``NamedTuple`` class.

    The hooks must be numba-compilable plain functions with exactly the parameter names
    of the module docstring's tables: ``(state, block_id)`` for ``contains``, ``touch``,
    ``insert`` and ``remove``, ``(state, block_ids, start, stop, reverse, evicted)`` for
    ``access``, ``(state, offsets, block_ids, start, stop, reverse, evicted, hit_blocks,
    used_blocks, evictions)`` for ``replay_independent`` (default :func:`replay_each_block`),
    ``(state)`` for ``used`` (default :func:`counters_used`) and ``evict``. They
    are compiled into a driver when it sees a state of this class; without JIT
    (``NUMBA_DISABLE_JIT=1``) they run as Python. The four tier hooks come together or
    not at all.

    Raises:
        ValueError: ``state_class`` is already registered, or some but not all of the tier
            hooks are given.
    """
    if state_class in _HOOKS:
        raise ValueError(f"kernel hooks for {state_class.__name__} are already registered")
    tier = {"touch": touch, "insert": insert, "evict": evict, "remove": remove}
    if any(h is None for h in tier.values()) and any(h is not None for h in tier.values()):
        missing = [name for name, h in tier.items() if h is None]
        raise ValueError(f"{state_class.__name__}: the tier hooks come together; missing {missing}")
    _HOOKS[state_class] = KernelHooks(contains, access, used, replay_independent, touch, insert, evict, remove)

    def is_mine(state: types.Type) -> bool:
        return isinstance(state, types.BaseNamedTuple) and state.instance_class is state_class

    @overload(kernel_contains, inline="always")
    def _contains(state, block_id):  # noqa: ANN001, ANN202, ARG001 - numba typing signature
        if is_mine(state):
            return contains

    @overload(kernel_access, inline="always")
    def _access(state, block_ids, start, stop, reverse, evicted):  # noqa: ANN001, ANN202, ARG001 - numba typing signature
        if is_mine(state):
            return access

    @overload(kernel_replay_independent, inline="always")
    def _replay_independent(state, offsets, block_ids, start, stop, reverse, evicted, hit_blocks, used_blocks,  # noqa: ANN001, ANN202, ARG001, PLR0913 - numba typing signature
                            evictions):  # noqa: ANN001, ARG001
        if is_mine(state):
            return replay_independent

    @overload(kernel_used, inline="always")
    def _used(state):  # noqa: ANN001, ANN202, ARG001 - numba typing signature
        if is_mine(state):
            return used

    if touch is None:
        return

    @overload(kernel_touch, inline="always")
    def _touch(state, block_id):  # noqa: ANN001, ANN202, ARG001 - numba typing signature
        if is_mine(state):
            return touch

    @overload(kernel_insert, inline="always")
    def _insert(state, block_id):  # noqa: ANN001, ANN202, ARG001 - numba typing signature
        if is_mine(state):
            return insert

    @overload(kernel_evict, inline="always")
    def _evict(state):  # noqa: ANN001, ANN202, ARG001 - numba typing signature
        if is_mine(state):
            return evict

    @overload(kernel_remove, inline="always")
    def _remove(state, block_id):  # noqa: ANN001, ANN202, ARG001 - numba typing signature
        if is_mine(state):
            return remove
