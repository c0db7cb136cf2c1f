"""Policy registry and the contract every registered policy must keep."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import chained_traces
from kvlab.policies import POLICIES, get_policy
from kvlab.sim import replay, replay_reference

ALL = sorted(POLICIES)


def test_unknown_policy_lists_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown policy 'belady2'; known policies: \[.*'lru'.*\]"):
        get_policy("belady2")


@pytest.mark.parametrize("name", ALL)
def test_spec_is_documented(name: str) -> None:
    spec = get_policy(name)
    assert spec.name == name and spec.summary and spec.models
    assert spec.reference.__doc__ and "Example" in spec.reference.__doc__


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("bad", [-1, 1.5, "3", True])
def test_reference_rejects_bad_capacity(name: str, bad: object) -> None:
    with pytest.raises(ValueError, match="capacity_blocks"):
        get_policy(name).reference(bad)


@pytest.mark.parametrize("name", ALL)
@given(keys=st.lists(st.integers(0, 20), max_size=200), capacity=st.integers(0, 8))
def test_reference_contract(name: str, keys: list[int], capacity: int) -> None:
    """Capacity never exceeded; an access makes the block resident; evictions balance
    (trace-aware references see ``keys`` as one request, so they use their future)."""
    spec = get_policy(name)
    cache = spec.reference(capacity, requests=[keys]) if spec.reference_uses_trace else spec.reference(capacity)
    inserted = evicted = 0
    for i, key in enumerate(keys):
        was_resident = key in cache
        out = cache.access(key, i)
        assert key not in out
        assert all(v not in cache for v in out)
        assert len(cache) <= capacity
        if capacity:
            assert key in cache
        inserted += (not was_resident) and capacity > 0
        evicted += len(out)
        assert len(cache) == inserted - evicted


@pytest.mark.parametrize("name", ALL)
@given(trace=chained_traces(), capacity=st.integers(0, 40))
def test_kernel_contract(name: str, trace, capacity: int) -> None:
    """Kernel: deterministic, equal to the reference, capacity never exceeded."""
    first = replay(trace, policy=name, capacity_blocks=capacity).requests
    again = replay(trace, policy=name, capacity_blocks=capacity).requests
    assert first.equals(again)
    assert first["used_blocks"].max() <= capacity
    ref = replay_reference(trace, policy=name, capacity_blocks=capacity).requests
    assert first["hit_blocks"].to_list() == ref["hit_blocks"].to_list()
    assert first["evictions"].to_list() == ref["evictions"].to_list()


@pytest.mark.parametrize("name", ["", "a,b", " lru2 ", "LRU2"])
def test_register_policy_rejects_names_the_cli_cannot_select(name: str) -> None:
    import dataclasses

    from kvlab.policies import register_policy

    with pytest.raises(ValueError, match="a policy name is lower-case"):
        register_policy(dataclasses.replace(get_policy("lru"), name=name))


def test_a_plug_in_exceeding_its_capacity_is_caught(conversation) -> None:
    import dataclasses

    from kvlab.policies import POLICIES, register_policy
    from kvlab.policies.lru import make_state

    def unbounded_state(flat, capacity_blocks):  # noqa: ANN001, ANN202 - ignores the capacity
        return make_state(flat, flat.num_keys)

    register_policy(dataclasses.replace(get_policy("lru"), name="leaky", make_state=unbounded_state))
    try:
        with pytest.raises(RuntimeError,
                           match=r"policy 'leaky' exceeded capacity_blocks=10: 14 blocks resident after request 0"):
            replay(conversation.head(50), policy="leaky", capacity_blocks=10)
    finally:
        POLICIES.pop("leaky")
