"""The contract every eviction policy plug-in fulfils.

A policy is two things that must agree exactly:

* a **reference class**: readable Python, one object per cache, implementing
  :class:`ReferencePolicy` (``key in cache``, ``cache.access(key, ref_index)``,
  ``len(cache)``) — the oracle the tests compare against — plus ``cache.remove(key)``
  (drop a resident block without an eviction) and ``cache.evict()`` (evict the block
  that inserting a new one into a full cache would), with which a caller such as a
  tiered store moves blocks out and enforces capacity itself (the kernels have no
  counterpart);
* **kernel hooks** for the numba replay: a ``NamedTuple`` of numpy arrays holding the
  state, and three small functions registered with :func:`register_kernel`:

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

The replay driver (:mod:`kvlab.sim.kernel`) calls :func:`kernel_contains`,
:func:`kernel_access` and :func:`kernel_used`; numba picks the policy's hook from the
type of ``state``, so adding a policy never touches the driver or its callers.
``access`` takes a whole request, not one block, for speed: numba reference-counts the
arrays passed to every call, and a call per block costs about 4× the LRU update itself
(measured: 47 vs 180 M block refs/s). The hooks are inlined into the driver at numba's IR
level (``overload(..., inline="always")``), which removes those calls where a request is
one block (an object-cache trace: 19 → 41 M refs/s for LRU on a Zipf stream) at the price
of about twice the compile time of a policy's first replay (1–4 s). Inside ``access``, bind the state's arrays to
locals once and loop over the blocks. The flat index ``i`` of a block in ``block_ids``
is its reference index (policies that look ahead, such as Belady, precompute
per-reference arrays in ``make_state``). ``evicted`` has room for ``stop - start`` ids:
a policy evicts at most one resident block per block it inserts (its capacity is
fixed), and must never write more — numba does not check bounds.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Protocol

import numpy as np
from numba import types
from numba.core.errors import NumbaIRAssumptionWarning
from numba.extending import overload

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
            "unbounded" to ``flat_trace.n_keys``).
        reference_uses_trace: the reference class needs the whole trace (a policy that
            reads per-reference facts such as a block's position or next use).
    """

    name: str
    summary: str
    models: str
    reference: Callable[..., ReferencePolicy]
    make_state: Callable[[FlatTrace, int], NamedTuple]
    reference_uses_trace: bool = False


def check_capacity(capacity_blocks: object) -> int | None:
    """``capacity_blocks`` as an ``int`` (``None`` = unbounded), checked the same way for
    every reference class.

    Raises:
        ValueError: negative, boolean or non-integer capacity.

    Example:
        >>> check_capacity(np.int64(8)), check_capacity(None)
        (8, None)
    """
    if capacity_blocks is not None and (isinstance(capacity_blocks, bool)
                                        or not isinstance(capacity_blocks, (int, np.integer))
                                        or capacity_blocks < 0):
        raise ValueError(f"capacity_blocks must be an integer >= 0 or None, got {capacity_blocks!r}")
    return None if capacity_blocks is None else int(capacity_blocks)


# Inlining the hooks makes numba's pedantic SSA check report variables of the inlined body
# as out of scope; the check is informational (the compiled code is unaffected, and the
# kernels are tested against the reference classes), so its noise is silenced here.
warnings.filterwarnings("ignore", category=NumbaIRAssumptionWarning, module="numba.core.ssa")

_PYTHON_HOOKS: dict[type, tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]] = {}


def kernel_contains(state: NamedTuple, block_id: int) -> bool:
    """Generic hook: is ``block_id`` resident? (dispatches on the state's type)."""
    return _PYTHON_HOOKS[type(state)][0](state, block_id)


def kernel_access(state: NamedTuple, block_ids: np.ndarray, start: int, stop: int, reverse: bool,
                  evicted: np.ndarray) -> int:
    """Generic hook: touch or insert one request's blocks; victims go to ``evicted``;
    returns their number."""
    return _PYTHON_HOOKS[type(state)][1](state, block_ids, start, stop, reverse, evicted)


def kernel_used(state: NamedTuple) -> int:
    """Generic hook: number of resident blocks."""
    return _PYTHON_HOOKS[type(state)][2](state)


def counters_used(state):  # noqa: ANN001, ANN201 - numba hook
    """The default ``used`` hook: a state whose ``counters[0]`` is its resident blocks."""
    return state.counters[0]


def register_kernel(state_class: type, *, contains: Callable[..., bool], access: Callable[..., int],
                    used: Callable[..., int] = counters_used) -> None:
    """Register a policy's kernel hooks for its state ``NamedTuple`` class.

    The hooks must be numba-compilable plain functions with exactly the parameter
    names ``(state, block_id)``, ``(state, block_ids, start, stop, reverse, evicted)``
    and ``(state)`` (``used`` defaults to :func:`counters_used`). They
    are compiled into the replay driver when it sees a state of this class; without
    JIT (``NUMBA_DISABLE_JIT=1``) they run as Python.

    Raises:
        ValueError: ``state_class`` is already registered.
    """
    if state_class in _PYTHON_HOOKS:
        raise ValueError(f"kernel hooks for {state_class.__name__} are already registered")
    _PYTHON_HOOKS[state_class] = (contains, access, used)

    def is_mine(state: types.Type) -> bool:
        return isinstance(state, types.BaseNamedTuple) and state.instance_class is state_class

    @overload(kernel_contains, inline="always")
    def _contains(state, block_id):  # noqa: ANN001 - numba typing signature
        if is_mine(state):
            return contains

    @overload(kernel_access, inline="always")
    def _access(state, block_ids, start, stop, reverse, evicted):  # noqa: ANN001
        if is_mine(state):
            return access

    @overload(kernel_used, inline="always")
    def _used(state):  # noqa: ANN001
        if is_mine(state):
            return used
