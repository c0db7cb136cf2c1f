"""The KV-event path of a cluster simulation (cluster_sim.md §6.3; rules C18, L17, L18): workers'
and tier stores' KV events, batched per publisher, through the fault injector to the router's
in-memory index."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable

from kvlab.events.types import BlockStored, EventBatch
from kvlab.index.faults import Delivery
from kvlab.index.ingest import EventIngestor
from kvlab.index.memory import InMemoryIndex
from kvlab.index.types import KNOWN_TIERS
from kvlab.sim.cluster.config import ClusterConfig
from kvlab.sim.cluster.prompts import PromptSource
from kvlab.sim.cluster.routers import RequestView
from kvlab.sim.cluster.tier_store import STORE_POD
from kvlab.sim.cluster.worker import Worker


class KvEventPath:
    """Publishers' KV events to an :class:`~kvlab.index.memory.InMemoryIndex` (``index`` is
    ``None`` when the router reads none: then nothing is published).

    Args:
        config: the cluster's configuration (its ``faults``, copied, delay or drop batches).
        prompts: the trace's prompts (token ids for ``BlockStored`` events, request keys).
        enabled: whether the router reads the index.
        schedule: ``schedule(delivered_s, worker_index, delivery)`` puts a delivery on the event
            loop (the loop calls :meth:`deliver` when it is due); ``worker_index`` is ``-1`` for
            the global store.
    """

    def __init__(self, config: ClusterConfig, prompts: PromptSource, enabled: bool,
                 schedule: Callable[[float, int, Delivery], None]) -> None:
        self.prompts = prompts
        self.schedule = schedule
        self.faults = copy.deepcopy(config.faults) if config.faults is not None else None
        self.index: InMemoryIndex | None = None
        self.ingestor: EventIngestor | None = None
        if enabled:
            known = dict.fromkeys([*KNOWN_TIERS, *(t.name.lower() for t in config.tiers)])
            self.index = InMemoryIndex(tiers=known)
            self.ingestor = EventIngestor(self.index, block_size=config.block_size)
        self.root = self.ingestor.hasher.root_key(None) if self.ingestor else 0
        self.store_seq = 0  # the global store's next KV-event seq

    def request_keys(self, request: RequestView) -> list[int]:
        """The index's keys of ``request``'s blocks."""
        return self.prompts.request_keys(list(request.engine_keys), self.ingestor.hasher, self.root)

    def publish(self, worker: Worker, now: float) -> None:
        """The GPU cache's KV events (with tokens, L18), then its own store's (tier updates, L17)
        in the same batch; the global store's as the publisher :data:`STORE_POD`."""
        if self.index is None:
            return
        events = [dataclasses.replace(e, token_ids=self.prompts.event_tokens(list(e.block_keys_u64())))
                  if isinstance(e, BlockStored) else e for e in worker.manager.take_events()]
        store = worker.store
        if store is not None and not store.shared and store.store.events:
            events += store.take_events()
        if events:
            self.send(worker.name, worker.kv_event_seq, worker.index, EventBatch(now, events))
            worker.kv_event_seq += 1
        if store is not None and store.shared and store.store.events:
            self.send(STORE_POD, self.store_seq, -1, EventBatch(now, store.take_events()))
            self.store_seq += 1

    def send(self, pod: str, seq: int, worker: int, batch: EventBatch) -> None:
        """One batch to the index: at once, or through the fault injector (C18)."""
        now = batch.ts
        deliveries = ([Delivery(now, now, pod, seq, batch)] if self.faults is None
                      else self.faults.inject([(now, pod, seq, batch)]))
        for d in deliveries:
            self.schedule(d.delivered_s, worker, d)

    def deliver(self, now: float, d: Delivery) -> None:  # noqa: ARG002
        """A due batch into the index."""
        self.ingestor.ingest_batch(d.pod, d.seq, d.batch)
