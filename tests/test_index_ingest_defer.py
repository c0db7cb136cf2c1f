"""An unknown parent (issue 14 item 9): llm-d drops the store and its whole chain; ``"defer"`` holds them.

llm-d ``pool.go`` :: ``processEventBatch`` (checked at llm-d/llm-d-kv-cache 7be76e1, 2026-06-12):
a ``BlockStored`` whose parent engine key ``GetRequestKey`` cannot resolve is skipped
(``continue``), so every later store chaining from its blocks names an unknown parent too.
``EventIngestor(unknown_parent="defer")`` holds such stores until a store maps the parent,
then applies them (and their held children) as if they had come in order. Exact scenarios
on every backend, with what each mode counts.
"""

from __future__ import annotations

import pytest

from kvlab.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from kvlab.hashing.llmd_hash import LlmdHasher
from kvlab.index import DeferredStores, EventIngestor, InMemoryIndex, PodEntry, RadixIndex

BS = 4
T1, T2, T3 = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12, 13]  # T3: one full block and a partial one
K1, K2, K3 = LlmdHasher(block_size=BS).block_hashes(T1 + T2 + T3)  # the request keys of the chain


def store(keys, tokens, parent=None, medium="GPU") -> BlockStored:
    return BlockStored(keys, parent, tokens, BS, None, medium, None)


S1, S2, S3 = store([11], T1), store([12], T2, parent=11), store([13], T3[:4], parent=12)


@pytest.fixture(params=["memory", "radix", "redis"])
def make_index(request: pytest.FixtureRequest):
    if request.param == "redis":
        return request.getfixturevalue("redis_index_factory")
    return {"memory": InMemoryIndex, "radix": RadixIndex}[request.param]


class Feed:
    """One ingestor; ``send(pod, *events)`` is one batch at the pod's next seq."""

    def __init__(self, index, **options) -> None:
        self.index, self.ingestor = index, EventIngestor(index, block_size=BS, **options)
        self.seqs: dict[str, int] = {}

    def send(self, pod: str, *events) -> str:
        seq = self.seqs.get(pod, 0)
        self.seqs[pod] = seq + 1
        return self.ingestor.ingest_batch(pod, seq, EventBatch(float(seq), list(events)))


def test_llmd_drops_a_chain_whose_parent_came_late(make_index) -> None:
    """S2 and S3 arrive before S1 (say S1's first publication was lost, and the pod stores it
    again): S2's parent 11 is unknown, S3's parent 12 is in the dropped S2 — both dropped."""
    feed = Feed(make_index())
    feed.send("pod-a", S2, S3)
    feed.send("pod-a", S1)
    assert feed.index.pod_keys("pod-a") == {K1}
    stats = feed.ingestor.stats
    assert stats.skipped == {"unknown_parent": 2} and stats.dropped_blocks == {"unknown_parent": 2}
    assert stats.applied == {"BlockStored": 1} and feed.ingestor.pending_stores == []


def test_deferring_applies_the_chain_once_the_parent_is_mapped(make_index) -> None:
    feed = Feed(make_index(), unknown_parent="defer")
    feed.send("pod-a", S2, S3)
    assert list(feed.index.items()) == []
    assert [(h.parent, h.engine_keys) for h in feed.ingestor.pending_stores] == [(11, (12,)), (12, (13,))]
    feed.send("pod-a", S1)
    assert feed.index.pod_keys("pod-a") == {K1, K2, K3}
    assert feed.index.get_request_key(13) == K3
    stats = feed.ingestor.stats
    assert stats.skipped == {"deferred": 2} and stats.deferred == {"resolved": 2}
    assert stats.applied == {"BlockStored": 1} and not stats.dropped_blocks and feed.ingestor.pending_stores == []


def test_a_parent_mapped_by_another_pod_resolves_the_store() -> None:
    """Engine keys are global (llm-d maps them for every pod): pod-b storing the parent block
    resolves pod-a's held store, for pod-a's entry."""
    feed = Feed(InMemoryIndex(), unknown_parent="defer")
    feed.send("pod-a", S2)
    feed.send("pod-b", S1)
    assert feed.index.pod_keys("pod-a") == {K2} and feed.index.pod_keys("pod-b") == {K1}


def test_what_the_pod_removed_meanwhile_is_removed_after_the_late_store() -> None:
    feed = Feed(InMemoryIndex(), unknown_parent="defer")
    feed.send("pod-a", S2, S3)
    feed.send("pod-a", BlockRemoved([13], "GPU"), BlockRemoved([12], "CPU"))  # the CPU one is another entry
    feed.send("pod-a", S1)
    assert feed.index.pod_keys("pod-a") == {K1, K2}
    assert feed.index.get_request_key(13) is None  # mapping dropped with its last entry


def test_storing_a_removed_block_again_cancels_the_removal() -> None:
    feed = Feed(InMemoryIndex(), unknown_parent="defer")
    feed.send("pod-a", S2, BlockRemoved([12], "GPU"), S2)  # evicted, recomputed: held twice
    feed.send("pod-a", S1)
    assert feed.index.pod_keys("pod-a") == {K1, K2}
    assert feed.ingestor.stats.deferred == {"resolved": 2}


def test_a_cleared_or_restarted_pod_loses_its_held_stores() -> None:
    feed = Feed(InMemoryIndex(), unknown_parent="defer")
    feed.send("pod-a", S2)
    feed.send("pod-b", S2, S3)
    feed.send("pod-a", AllBlocksCleared())
    assert feed.ingestor.stats.deferred == {"cleared": 1}
    feed.ingestor.ingest_batch("pod-b", 0, EventBatch(99.0, []))  # seq back to 0, later clock: a restart
    stats = feed.ingestor.stats
    assert stats.deferred == {"cleared": 3} and stats.dropped_blocks == {"cleared": 3}
    feed.send("pod-c", S1)
    assert feed.index.pod_keys("pod-a") == feed.index.pod_keys("pod-b") == set() and not stats.deferred["resolved"]


def test_a_tier_scoped_clear_keeps_the_other_tiers_held_stores() -> None:
    feed = Feed(InMemoryIndex(), unknown_parent="defer")
    feed.send("pod-a", S2, store([12], T2, parent=11, medium="CPU"))
    feed.send("pod-a", AllBlocksCleared(medium="CPU"))
    feed.send("pod-a", S1)
    assert feed.index.lookup([K1, K2])[K2] == (PodEntry("pod-a", "gpu"),)
    assert feed.ingestor.stats.deferred == {"cleared": 1, "resolved": 1}


def test_a_full_holder_drops_its_oldest_store() -> None:
    feed = Feed(InMemoryIndex(), unknown_parent="defer", max_deferred=1)
    feed.send("pod-a", S2, S3)
    stats = feed.ingestor.stats
    assert stats.deferred == {"overflow": 1} and stats.dropped_blocks == {"overflow": 1}
    feed.send("pod-a", S1)
    assert feed.index.pod_keys("pod-a") == {K1}  # S3 waits for 12, which S2 would have mapped
    assert [h.parent for h in feed.ingestor.pending_stores] == [12] and feed.ingestor.max_deferred == 1


def test_a_held_store_that_fails_when_applied_is_recorded() -> None:
    feed = Feed(InMemoryIndex(), unknown_parent="defer")
    feed.send("pod-a", BlockStored([12, 14], 11, [5, 6, 7, 8, 9, 10], 3, None, "GPU", None))  # engine blocks of 3
    feed.send("pod-a", S1)
    (error,) = feed.ingestor.stats.errors
    assert (error.pod, error.seq, error.event_index, error.event_type) == ("pod-a", 0, 0, "BlockStored")
    assert "not multiples of one another" in error.message and feed.ingestor.stats.skipped["error"] == 1


@pytest.mark.parametrize(("options", "match"), [
    ({"unknown_parent": "keep"}, "unknown_parent must be one of"),
    ({"max_deferred": 0}, "max_deferred must be an integer >= 1, got 0"),
])
def test_the_options_are_checked(options: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EventIngestor(InMemoryIndex(), **options)
    with pytest.raises(ValueError, match="max_stores"):
        DeferredStores(max_stores=-1)
