"""FaultInjector and DeliveryReplay: seeded delivery faults between KV events and the index.

Same seed, same deliveries; no faults is the identity; Opal-style coalescing holds messages
to the next 30 s tick; duplicates are never applied twice; loss shows up as the ingestor's
gaps; swaps as late batches; a restart clears the pod's entries.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvlab.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from kvlab.index import EventIngestor, SeqGap
from kvlab.index.faults import Delivery, DeliveryReplay, FaultInjector
from kvlab.index.memory import InMemoryIndex

BS = 4


def store(key: int) -> BlockStored:
    """Block ``key`` from the root, tokens ``[key] * BS``."""
    return BlockStored(block_hashes=[key], parent_block_hash=None, token_ids=[key % 2**32] * BS, block_size=BS,
                       lora_id=None, medium="GPU", lora_name=None)


def stream(n: int, pods=("pod-a", "pod-b"), seed: int = 3) -> list[tuple]:
    """``n`` messages per pod, one per second: each stores a new block or removes an older one."""
    rng = np.random.default_rng(seed)
    out = []
    for p, pod in enumerate(pods):
        held: list[int] = []
        for seq in range(n):
            key = 1000 * (p + 1) + seq
            if held and rng.random() < 0.4:
                event = BlockRemoved([held.pop(int(rng.integers(len(held))))], "GPU")
            else:
                held.append(key)
                event = store(key)
            out.append((float(seq) + 0.1 * p, pod, seq, EventBatch(float(seq), [event])))
    return out


def ingest_all(deliveries, **kwargs) -> EventIngestor:
    ingestor = EventIngestor(InMemoryIndex(), block_size=BS, **kwargs)
    DeliveryReplay(ingestor, deliveries).advance_to(math.inf)
    return ingestor


def view(ingestor: EventIngestor) -> dict[str, set[int]]:
    return {pod: ingestor.index.pod_keys(pod) for pod in ("pod-a", "pod-b")}


ALL_FAULTS = {"delay_s": 0.5, "jitter_s": 2.0, "coalesce_s": 5.0, "loss_p": 0.1, "duplicate_p": 0.2,
              "duplicate_lag_s": 3.0, "swap_p": 0.2, "restarts": [(7.5, "pod-a")]}


def test_the_same_seed_gives_the_same_deliveries() -> None:
    messages = stream(30)
    first = FaultInjector(seed=11, **ALL_FAULTS).inject(messages)
    assert first == FaultInjector(seed=11, **ALL_FAULTS).inject(messages)
    assert first == FaultInjector(seed=np.random.default_rng(11), **ALL_FAULTS).inject(messages)
    assert first != FaultInjector(seed=12, **ALL_FAULTS).inject(messages)
    assert [d.delivered_s for d in first] == sorted(d.delivered_s for d in first)


def test_no_faults_is_the_identity() -> None:
    messages = stream(20)
    injector = FaultInjector(seed=5)
    deliveries = injector.inject(list(reversed(messages)))
    assert [(d.sent_s, d.pod, d.seq, d.batch) for d in deliveries] == sorted(messages, key=lambda m: m[0])
    assert all(d.delivered_s == d.sent_s and not d.copy for d in deliveries)
    assert injector.stats == {"messages": 40}
    assert view(ingest_all(deliveries)) == view(ingest_all(FaultInjector(seed=9).inject(messages)))


def test_a_fixed_delay_shifts_every_message() -> None:
    deliveries = FaultInjector(delay_s=1.5).inject(stream(5))
    assert [d.delivered_s for d in deliveries] == [d.sent_s + 1.5 for d in deliveries]


def test_coalescing_holds_a_pods_messages_to_the_next_tick() -> None:
    batch = EventBatch(0.0, [])
    messages = [(0.0, "p", 0, batch), (29.9, "p", 1, batch), (30.0, "p", 2, batch), (61.0, "p", 3, batch)]
    deliveries = FaultInjector(coalesce_s=30.0).inject(messages)
    assert [(d.delivered_s, d.seq) for d in deliveries] == [(30.0, 0), (30.0, 1), (60.0, 2), (90.0, 3)]


def test_the_index_is_stale_until_the_flush() -> None:
    """Opal's 30 s coalescing: a block stored at t=1 reaches the index at t=30."""
    ingestor = EventIngestor(InMemoryIndex(), block_size=BS)
    deliveries = FaultInjector(coalesce_s=30.0, delay_s=0.25).inject([(1.0, "pod-a", 0, EventBatch(1.0, [store(7)]))])
    replay = DeliveryReplay(ingestor, deliveries)
    assert replay.advance_to(30.0) == 0 and ingestor.index.pod_keys("pod-a") == set()
    assert replay.advance_to(30.25) == 1 and len(ingestor.index.pod_keys("pod-a")) == 1
    assert (replay.now_s, replay.applied, replay.pending) == (30.25, 1, 0)


def test_duplicates_are_never_applied_twice() -> None:
    messages = stream(40)
    injector = FaultInjector(seed=2, duplicate_p=0.5, duplicate_lag_s=4.0)
    deliveries = injector.inject(messages)
    faulty, clean = ingest_all(deliveries), ingest_all(FaultInjector().inject(messages))
    copies = sum(d.copy for d in deliveries)
    assert copies == injector.stats["duplicated"] > 10
    assert faulty.stats.batches == {"applied": 80, "duplicate": copies}
    assert view(faulty) == view(clean) and faulty.stats.applied == clean.stats.applied
    assert any(isinstance(d.batch.events[0], BlockStored) and d.copy for d in deliveries)  # a store came back late


def missing_runs(deliveries, pod: str) -> list[SeqGap]:
    """The gaps a reader of ``pod``'s delivered seqs (in order, from 0) must report."""
    seqs = [d.seq for d in deliveries if d.pod == pod]
    gaps, expected = [], 0
    for seq in seqs:
        if seq > expected:
            gaps.append(SeqGap(pod, expected, seq))
        expected = seq + 1
    return gaps


def test_lost_messages_show_up_as_gaps() -> None:
    injector = FaultInjector(seed=4, loss_p=0.3)
    deliveries = injector.inject(stream(50))
    ingestor = ingest_all(deliveries, initial_seq=0)
    assert len(deliveries) == 100 - injector.stats["lost"] and injector.stats["lost"] > 15
    for pod in ("pod-a", "pod-b"):
        assert [g for g in ingestor.stats.gaps if g.pod == pod] == missing_runs(deliveries, pod) != []
    assert sum(c["missed_seqs"] for c in ingestor.stats.pods.values()) <= injector.stats["lost"]
    assert not ingestor.stats.batches["duplicate"] and not ingestor.stats.batches["late"]


def test_swapped_neighbours_arrive_late_and_are_not_applied() -> None:
    batches = [EventBatch(float(s), [store(100 + s)]) for s in range(4)]
    injector = FaultInjector(swap_p=1.0)
    deliveries = injector.inject([(float(s), "pod-a", s, b) for s, b in enumerate(batches)])
    assert [(d.seq, d.delivered_s) for d in deliveries] == [(1, 0.0), (0, 1.0), (3, 2.0), (2, 3.0)]
    ingestor = ingest_all(deliveries)
    assert ingestor.stats.batches == {"applied": 1, "gap": 1, "late": 2} and injector.stats["swapped"] == 2
    assert ingestor.stats.gaps == [SeqGap("pod-a", 2, 3)]  # seq 1 set the baseline


def test_a_restart_sends_a_clear_at_seq_zero_and_renumbers_later_messages() -> None:
    messages = [(float(s), "pod-a", s, EventBatch(float(s), [store(100 + s)])) for s in range(6)]
    messages.append((4.0, "pod-b", 0, EventBatch(4.0, [store(900)])))
    injector = FaultInjector(restarts=[(2.5, "pod-a")])
    deliveries = injector.inject(messages)
    assert [(d.sent_s, d.seq) for d in deliveries if d.pod == "pod-a"] == [
        (0.0, 0), (1.0, 1), (2.0, 2), (2.5, 0), (3.0, 1), (4.0, 2), (5.0, 3)]
    restart = deliveries[3]
    assert restart.batch == EventBatch(2.5, [AllBlocksCleared()]) and injector.stats["restarts"] == 1
    ingestor = ingest_all(deliveries)
    assert ingestor.stats.batches == {"applied": 7, "restart": 1} and not ingestor.stats.gaps
    assert len(ingestor.index.pod_keys("pod-a")) == 3 and len(ingestor.index.pod_keys("pod-b")) == 1
    # the restart message lost: seq 1 with a later ts is still a restart, and 0 is a gap
    ingestor = ingest_all([d for d in deliveries if d is not restart])
    assert ingestor.stats.batches["restart"] == 1 and ingestor.stats.gaps == [SeqGap("pod-a", 0, 1)]
    assert len(ingestor.index.pod_keys("pod-a")) == 3


def test_a_restart_batch_is_stamped_after_the_pods_last_batch() -> None:
    messages = [(0.0, "p", 0, EventBatch(100.0, []))]
    (_, restart) = FaultInjector(restarts=[(1.0, "p")]).inject(messages)
    assert restart.batch.ts == math.nextafter(100.0, math.inf) and restart.seq == 0
    (only,) = FaultInjector(restarts=[(1.0, "q")]).inject([])
    assert (only.pod, only.seq, only.batch.ts) == ("q", 0, 1.0)


def test_replay_refuses_going_back_and_unsorted_deliveries() -> None:
    ingestor = EventIngestor(InMemoryIndex())
    batch = EventBatch(0.0, [])
    replay = DeliveryReplay(ingestor, [Delivery(1.0, 0.0, "p", 0, batch)])
    assert replay.advance_to(5.0) == 1
    with pytest.raises(ValueError, match=r"^t_s must be a number >= 5.0, got 4.0$"):
        replay.advance_to(4.0)
    with pytest.raises(ValueError, match="sort them by delivered_s"):
        DeliveryReplay(ingestor, [Delivery(2.0, 0.0, "p", 0, batch), Delivery(1.0, 0.0, "p", 1, batch)])
    with pytest.raises(ValueError, match="ingestor must be an EventIngestor"):
        DeliveryReplay(InMemoryIndex(), [])
    with pytest.raises(ValueError, match=r"deliveries\[0\] must be a Delivery"):
        DeliveryReplay(ingestor, [(1.0, "p", 0, batch)])


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"seed": -1}, "seed must be an integer >= 0 or a numpy.random.Generator, got -1"),
    ({"delay_s": -1.0}, "delay_s must be a finite number >= 0"),
    ({"jitter_s": math.inf}, "jitter_s must be a finite number"),
    ({"coalesce_s": 0.0}, "coalesce_s must be a finite number > 0"),
    ({"loss_p": 1.5}, r"loss_p must be a finite number in \[0.0, 1.0\], got 1.5"),
    ({"duplicate_p": -0.1}, r"duplicate_p must be a finite number in \[0.0, 1.0\], got -0.1"),
    ({"swap_p": True}, r"swap_p must be a finite number in \[0.0, 1.0\], got True"),
    ({"restarts": [(1.0,)]}, r"restarts\[0\] must be a \(time_s, pod\) pair"),
    ({"restarts": [(1.0, "")]}, r"restarts\[0\] pod must be a non-empty str, got ''"),
    ({"restarts": [(-1.0, "p")]}, r"restarts\[0\] time_s must be"),
])
def test_bad_options_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FaultInjector(**kwargs)


@pytest.mark.parametrize(("message", "match"), [
    ((1.0, "p", 0), r"messages\[0\] must be \(sent_s, pod, seq, EventBatch\)"),
    ((-1.0, "p", 0, EventBatch(0.0, [])), r"messages\[0\] sent_s must be"),
    ((1.0, "", 0, EventBatch(0.0, [])), r"messages\[0\] pod must be"),
    ((1.0, "p", -2, EventBatch(0.0, [])), r"messages\[0\] seq must be"),
    ((1.0, "p", 0, []), r"messages\[0\] batch must be an EventBatch"),
])
def test_bad_messages_are_refused(message: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FaultInjector().inject([message])
