"""One query scored over an index fed by a stream of KV events (notebook 07, section 1)."""

from __future__ import annotations

import polars as pl
import pytest

from kvlab.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from kvlab.index import (
    EventIngestor,
    FaultInjector,
    InMemoryIndex,
    MaxPrefixScorer,
    replay_stream,
    request_keys_for_tokens,
)

BLOCK, PODS = 4, ["pod-a", "pod-b"]
SYS, A, B, NEXT = [1, 2, 3, 4, 5, 6, 7, 8], [11, 12, 13, 14, 15, 16, 17, 18], [21, 22, 23, 24], [31, 32, 33, 34]


def stored(engine_keys: list[int], parent: int | None, tokens: list[int], medium: str = "GPU") -> BlockStored:
    return BlockStored(engine_keys, parent, tokens, BLOCK, None, medium, None)


# Both pods share SYS; pod-a serves A, pod-b B, then the query (A's next turn) lands on pod-b.
STREAM = [
    (0.0, "pod-a", 0, [stored([101, 102, 103, 104], None, SYS + A)]),
    (10.0, "pod-b", 0, [stored([101, 102, 105], None, SYS + B)]),
    (20.0, "pod-a", 1, [stored([104], None, [], "CPU"), BlockRemoved([104], "GPU")]),  # offload A's last block
    (30.0, "pod-b", 1, [stored([103, 104, 106], 102, A + NEXT)]),
    (40.0, "pod-a", 2, [AllBlocksCleared()]),
    (50.0, "pod-b", 2, [BlockRemoved([106], "GPU")]),
]
MESSAGES = [(t, pod, seq, EventBatch(t, events)) for t, pod, seq, events in STREAM]
STEP_S = [t for t, *_ in STREAM]
QUERY = request_keys_for_tokens(SYS + A + NEXT, EventIngestor(InMemoryIndex(), block_size=BLOCK).hasher)


def run(injector: FaultInjector, **kwargs: object):
    return replay_stream(injector.inject(MESSAGES), QUERY, PODS, STEP_S, block_size=BLOCK, **kwargs)


def test_delivered_at_once_the_index_follows_the_pods_exactly() -> None:
    fresh = run(FaultInjector())
    # gpu 1.0, cpu 0.8 per block (llm-d's weights): 4 SYS+A blocks; then A's last on CPU; pod-a reset ...
    assert fresh.scores.pivot(on="pod", index="step", values="score").rows() == [
        (0, 4.0, 0.0), (1, 4.0, 2.0), (2, 3.8, 2.0), (3, 3.8, 5.0), (4, 0.0, 5.0), (5, 0.0, 4.0)]
    assert fresh.scores["time_s"].unique(maintain_order=True).to_list() == STEP_S
    assert not fresh.picks(fresh)["wrong"].any() and fresh.ingestor.stats.gaps == []


def test_coalesced_events_keep_the_router_on_a_stale_state() -> None:
    fresh, coalesced = run(FaultInjector()), run(FaultInjector(coalesce_s=30.0))
    assert coalesced.scores.filter(pl.col("step") < 3)["score"].to_list() == [0.0] * 6  # nothing until t = 30 s
    assert coalesced.scores.filter(step=4)["score"].to_list() == [3.8, 2.0]  # step 2's state until t = 60 s
    wrong = coalesced.picks(fresh).filter("wrong")["step"].to_list()
    assert {3, 4, 5} <= set(wrong)


def test_a_lost_message_is_a_gap_and_its_blocks_stay_unknown() -> None:
    fresh, lossy = run(FaultInjector()), run(FaultInjector(seed=1, loss_p=0.1))
    assert lossy.picks(fresh).filter("wrong")["step"].to_list() == [3]  # pod-b's seq 1 was lost
    assert [g.got_seq for g in lossy.ingestor.stats.gaps] == [2]
    assert lossy.scores.filter(step=5, pod="pod-b")["score"].item() == 2.0  # a hit publishes nothing


def test_another_scorer_and_bad_arguments() -> None:
    max_prefix = run(FaultInjector(), scorer=MaxPrefixScorer())
    assert max_prefix.scores.filter(step=3)["score"].to_list() == [0.8, 1.0]  # matched fraction, any tier
    with pytest.raises(ValueError, match="scorer must be a kvlab.index Scorer"):
        run(FaultInjector(), scorer="llmd")
    with pytest.raises(ValueError, match=r"step_s\[0\] must be a finite number"):
        replay_stream([], QUERY, PODS, ["0"])
    with pytest.raises(ValueError, match=r"t_s must be a number >= 2.0, got 1.0"):
        replay_stream([], QUERY, PODS, [2.0, 1.0])
    with pytest.raises(ValueError, match="pods lists 'pod-a' twice"):
        replay_stream([], QUERY, ["pod-a", "pod-a"], [0.0])
    fresh = run(FaultInjector())
    with pytest.raises(ValueError, match="truth must score the same steps and pods"):
        fresh.picks(fresh.scores.head(2))
