"""The seeded chat-session generator."""

from __future__ import annotations

import numpy as np
import pytest

from kvlab.traces import ChatWorkload, chat_sessions

SMALL = ChatWorkload(num_sessions=40, mean_turns=3.0, system_prompt_tokens=1000, block_size=64)


def test_same_seed_same_trace_other_seed_other_trace() -> None:
    a, b = chat_sessions(SMALL, seed=7), chat_sessions(SMALL, seed=7)
    assert a.frame.equals(b.frame)
    assert a.source == b.source and "seed=7" in a.source
    assert not chat_sessions(SMALL, seed=8).frame.equals(a.frame)
    rng_trace = chat_sessions(SMALL, seed=np.random.default_rng(7))
    assert rng_trace.frame.equals(a.frame)


def test_chained_and_in_arrival_order() -> None:
    trace = chat_sessions(SMALL, seed=1)
    assert trace.check_chained().height == 0
    assert trace.frame["arrival_s"].is_sorted()


def test_system_prompt_blocks_are_shared_by_every_session() -> None:
    trace = chat_sessions(SMALL, seed=2)
    shared = SMALL.system_prompt_tokens // SMALL.block_size  # 15 full blocks
    heads = {tuple(k[:shared]) for k in trace.frame["block_keys"].to_list()}
    assert heads == {tuple(range(shared))}


def test_each_turn_extends_the_previous_prompt_of_its_session() -> None:
    trace = chat_sessions(SMALL, seed=3)
    bs = SMALL.block_size
    for _, group in trace.frame.group_by("session_id"):
        rows = group.sort("arrival_s").iter_rows(named=True)
        prev = next(rows)
        for row in rows:
            full = prev["input_tokens"] // bs
            assert row["input_tokens"] > prev["input_tokens"] + prev["output_tokens"]
            assert row["block_keys"][:full] == prev["block_keys"][:full]
            assert set(row["block_keys"][full:]).isdisjoint(prev["block_keys"])
            prev = row


def test_sessions_stop_before_max_input() -> None:
    trace = chat_sessions(ChatWorkload(num_sessions=30, mean_turns=20, max_input_tokens=4000, block_size=64), seed=0)
    assert trace.frame["input_tokens"].max() <= 4000


@pytest.mark.parametrize(("field", "value"), [
    ("num_sessions", 0), ("num_sessions", 2.5), ("mean_turns", 0.5), ("block_size", 0),
    ("user_tokens_mean", -1.0), ("think_time_mean_s", float("nan")), ("system_prompt_tokens", -1),
    ("max_input_tokens", 100),
])
def test_invalid_workload_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        ChatWorkload(**{field: value})


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="workload must be a ChatWorkload or None, got 5"):
        chat_sessions(5)
    with pytest.raises(ValueError, match="seed must be an integer >= 0 or a numpy.random.Generator, got None"):
        chat_sessions(SMALL, seed=None)
    with pytest.raises(ValueError, match="no request generated"):
        chat_sessions(ChatWorkload(num_sessions=3, user_tokens_mean=1e9), seed=0)


def test_zipf_objects_is_seeded_and_skewed() -> None:
    from kvlab.traces import zipf_objects

    a, b = zipf_objects(20_000, 1_000, alpha=1.0, seed=3), zipf_objects(20_000, 1_000, alpha=1.0, seed=3)
    assert a.frame.equals(b.frame) and a.block_size == 1
    counts = np.bincount(a.flat.block_ids)
    top = np.sort(counts)[::-1]
    # rank 1 vs rank 2 frequency ≈ 2 for alpha = 1 (harmonic weights)
    assert 1.7 < top[0] / top[1] < 2.3
    uniform = np.bincount(zipf_objects(20_000, 1_000, alpha=0.0, seed=3).flat.block_ids)
    assert uniform.max() < 60
    with pytest.raises(ValueError, match="num_objects must be an integer >= 1, got 0"):
        zipf_objects(10, 0)
