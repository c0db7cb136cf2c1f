"""Cluster-global KV index speed: kvlab's InMemoryIndex and RedisIndex beside Opal's KVBM.

The anchor (in this file) is a plain dict-of-sets index written the way Opal's KVBM keeps
its state (docs/specs/index_blend.md rules O9, O11): per worker a set of chunk hashes, and
a reverse index chunk hash -> set(worker); a lookup walks the request's chunks until the
first one no worker holds. It has no engine-key mapping, no tiers and no entry objects,
so it is the floor a Python index can reach, not a like-for-like rival.

State: 64 pods; ``--keys`` background request keys (default 2**20), stored as 16-block
``add`` calls of one pod each (engine keys distinct from request keys, 1:1); plus one
128-block request held by every pod to a different depth (pod p holds its first
2(p+1) blocks), so key j carries 64 - j//2 entries.

1. ``add``: stores of 16 blocks per second while filling the state (``Index.add`` with
   known keys; the anchor's ``insert``).
2. ``ingest``: events per second through :class:`kvlab.index.ingest.EventIngestor` on the
   filled state: ``BlockStored`` events of 16 blocks x 16 tokens, chained per pod (the
   parent resolved through the index), request keys hashed from the tokens with llm-d's
   hasher. The anchor gets the same events and hashes them with the same hasher (chaining
   per pod itself, as Opal's workers do), so both pay the same hashing.
3. ``lookup``: lookups per second of the 128-block request over all pods
   (``Index.lookup``, stop at the first miss; the anchor's walk). Every index must
   return the same pods per key, after the fill and after the ingest.
4. Memory per request key: ``tracemalloc`` over a build of ``--memory-keys`` keys (default
   131,072; the Python indexes), ``INFO memory`` ``used_memory`` growth over the full fill
   (Redis; hashes and engine sorted sets both counted).

InMemoryIndex runs with ``pod_cache_size=64`` (llm-d's default of 10 would keep only 10
of the 64 pods on the request's first keys). RedisIndex talks to a ``redis-server`` this
benchmark starts on a free loopback port (``--redis-keys`` scales its state down; the
JSON says which size ran). No target is set by the issue; the ratios are reported (kvlab
throughput / anchor throughput, kvlab bytes / anchor bytes). Usage:
``python benchmarks/bench_index.py --out out/bench/bench_index.json``.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from kvlab.events import BlockStored, EventBatch
from kvlab.hashing.llmd_hash import LlmdHasher
from kvlab.index import PodEntry
from kvlab.index.base import Index
from kvlab.index.ingest import EventIngestor
from kvlab.index.local_redis import LocalRedisServer
from kvlab.index.memory import InMemoryIndex
from kvlab.index.redis_index import RedisIndex

sys.path.insert(0, str(Path(__file__).parent))
from report import machine_info, write_report  # noqa: E402 - benchmarks/ is on sys.path

PODS = 64
BLOCKS_PER_STORE = 16
TOKENS_PER_BLOCK = 16
REQUEST_BLOCKS = 128
SEED = 7
POD_NAMES = [f"pod-{p:02d}" for p in range(PODS)]


class OpalKVBM:
    """Opal's KVBM state as plain dicts of sets (rules O9, O11): worker -> chunk hashes, chunk -> workers."""

    def __init__(self) -> None:
        self.worker_chunks: dict[str, set[int]] = {}
        self.chunk_workers: dict[int, set[str]] = {}

    def insert(self, worker: str, chunk_hashes: list[int]) -> None:
        """An INSERT event: the worker now holds these chunks (its state created lazily, O9)."""
        chunks = self.worker_chunks.get(worker)
        if chunks is None:
            chunks = self.worker_chunks[worker] = set()
        reverse = self.chunk_workers
        for chunk in chunk_hashes:
            chunks.add(chunk)
            workers = reverse.get(chunk)
            if workers is None:
                reverse[chunk] = {worker}
            else:
                workers.add(worker)

    def lookup(self, chunk_hashes: list[int]) -> dict[int, set[str]]:
        """The workers of each chunk, walking from the first until one no worker holds (O11)."""
        out = {}
        for chunk in chunk_hashes:
            workers = self.chunk_workers.get(chunk)
            if not workers:
                break
            out[chunk] = workers
        return out


class Workload:
    """Background stores and the 128-block request, from one seeded generator (u64 keys as int64 > 0)."""

    def __init__(self, num_keys: int, seed: int = SEED) -> None:
        rng = np.random.default_rng(seed)
        self.n_stores = num_keys // BLOCKS_PER_STORE
        n = self.n_stores * BLOCKS_PER_STORE
        self.request = rng.integers(1, 2**63, n + REQUEST_BLOCKS, dtype=np.int64)
        self.engine = rng.integers(1, 2**63, n + REQUEST_BLOCKS, dtype=np.int64)
        self.num_keys = n + REQUEST_BLOCKS
        self.hot = self.request[n:].tolist()
        self.hot_engine = self.engine[n:].tolist()

    def stores(self) -> Iterator[tuple[int, list[int], list[int]]]:
        """``(pod, engine keys, request keys)`` of every store: background first, then the request's."""
        for i in range(self.n_stores):
            lo = i * BLOCKS_PER_STORE
            hi = lo + BLOCKS_PER_STORE
            yield i % PODS, self.engine[lo:hi].tolist(), self.request[lo:hi].tolist()
        for p in range(PODS):
            depth = 2 * (p + 1)
            for lo in range(0, depth, BLOCKS_PER_STORE):
                hi = min(lo + BLOCKS_PER_STORE, depth)
                yield p, self.hot_engine[lo:hi], self.hot[lo:hi]

    def fill_index(self, index: Index) -> tuple[float, int]:
        """Seconds to add every store to ``index``, and the number of stores."""
        entries = [[PodEntry(name)] for name in POD_NAMES]
        n = 0
        start = time.perf_counter()
        for pod, engine_keys, request_keys in self.stores():
            index.add(engine_keys, request_keys, entries[pod])
            n += 1
        return time.perf_counter() - start, n

    def fill_kvbm(self, kvbm: OpalKVBM) -> tuple[float, int]:
        """Seconds to insert every store into the anchor, and the number of stores."""
        n = 0
        start = time.perf_counter()
        for pod, _, request_keys in self.stores():
            kvbm.insert(POD_NAMES[pod], request_keys)
            n += 1
        return time.perf_counter() - start, n


def ingest_events(n_events: int, seed: int = SEED + 1) -> list[tuple[str, int, EventBatch]]:
    """``(pod, seq, batch)``: one 16-block ``BlockStored`` per batch, chained per pod from the root."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 50_000, (n_events, BLOCKS_PER_STORE * TOKENS_PER_BLOCK)).tolist()
    engine = rng.integers(1, 2**63, (n_events, BLOCKS_PER_STORE), dtype=np.int64).tolist()
    last: dict[int, int] = {}
    out = []
    for i in range(n_events):
        pod = i % PODS
        event = BlockStored(engine[i], last.get(pod), tokens[i], TOKENS_PER_BLOCK, None, "GPU", None)
        out.append((POD_NAMES[pod], i // PODS, EventBatch(float(i), [event])))
        last[pod] = engine[i][-1]
    return out


def ingest_index(index: Index, events: list[tuple[str, int, EventBatch]]) -> float:
    """Seconds for an EventIngestor to apply ``events`` to ``index`` (all must apply)."""
    ingestor = EventIngestor(index, block_size=TOKENS_PER_BLOCK)
    start = time.perf_counter()
    for pod, seq, batch in events:
        ingestor.ingest_batch(pod, seq, batch)
    seconds = time.perf_counter() - start
    if ingestor.stats.applied["BlockStored"] != len(events):
        raise AssertionError(f"the ingestor applied {dict(ingestor.stats.applied)} of {len(events)} stores: "
                             f"skipped {dict(ingestor.stats.skipped)}")
    return seconds


def ingest_kvbm(kvbm: OpalKVBM, events: list[tuple[str, int, EventBatch]]) -> tuple[float, list[list[int]]]:
    """Seconds for the anchor to hash (llm-d's hasher, chained per pod) and insert ``events``; the keys."""
    hasher = LlmdHasher(block_size=TOKENS_PER_BLOCK)
    last: dict[str, int] = {}
    keys = []
    start = time.perf_counter()
    for pod, _, batch in events:
        chunks = hasher.block_hashes(batch.events[0].token_ids, parent_key=last.get(pod, 0))
        kvbm.insert(pod, chunks)
        last[pod] = chunks[-1]
        keys.append(chunks)
    return time.perf_counter() - start, keys


def rate(fn: Callable[[], object], min_s: float, min_calls: int = 20) -> float:
    """Calls per second of ``fn``, called until ``min_s`` seconds and ``min_calls`` calls have passed."""
    calls = 0
    start = time.perf_counter()
    while calls < min_calls or time.perf_counter() - start < min_s:
        fn()
        calls += 1
    return calls / (time.perf_counter() - start)


def pods_per_key(found: dict) -> dict[int, list[str]]:
    """A lookup's answer as sorted pod names per key (entries or worker sets)."""
    return {key: sorted({e.pod if isinstance(e, PodEntry) else e for e in held}) for key, held in found.items()}


def run(name: str, index: Index, num_keys: int, events: list, lookup_s: float,
        memory_probe: Callable[[], int] | None = None) -> dict:
    """Fill, look up and ingest on ``index`` and on a fresh anchor; check both answer alike.

    ``memory_probe`` (bytes used by the backend) is read before and after the fill."""
    work = Workload(num_keys)
    kvbm = OpalKVBM()
    fill_s, stores = work.fill_kvbm(kvbm)
    anchor = {"add_stores_per_s": stores / fill_s, "lookups_per_s": rate(lambda: kvbm.lookup(work.hot), lookup_s)}
    expected = pods_per_key(kvbm.lookup(work.hot))
    before = memory_probe() if memory_probe else 0
    fill_s, _ = work.fill_index(index)
    kvlab = {"add_stores_per_s": stores / fill_s}
    if memory_probe:
        kvlab["bytes_per_key"] = (memory_probe() - before) / work.num_keys
    if pods_per_key(index.lookup(work.hot)) != expected:
        raise AssertionError(f"{name}: the 128-block request's lookup differs from the anchor's")
    kvlab["lookups_per_s"] = rate(lambda: index.lookup(work.hot), lookup_s)
    # each ingest starts with the collector's counts reset: a full collection of the whole heap
    # (both states) would otherwise land in whichever of the two crosses the threshold
    gc.collect()
    kvlab["ingest_events_per_s"] = len(events) / ingest_index(index, events)
    gc.collect()
    anchor_s, event_keys = ingest_kvbm(kvbm, events)
    anchor["ingest_events_per_s"] = len(events) / anchor_s
    for keys in event_keys[-PODS:]:
        if pods_per_key(index.lookup(keys)) != pods_per_key(kvbm.lookup(keys)):
            raise AssertionError(f"{name}: an ingested store's lookup differs from the anchor's")
    ratios = {f"ratio_{k}": kvlab[k] / anchor[k] for k in ("add_stores_per_s", "lookups_per_s", "ingest_events_per_s")}
    return {"keys": work.num_keys, "stores": stores, "ingest_events": len(events), "kvlab": kvlab,
            "opal_kvbm": anchor, **ratios}


def traced_bytes_per_key(num_keys: int, build: Callable[[Workload], object]) -> float:
    """Bytes ``tracemalloc`` sees ``build`` keep, per request key of an ``num_keys`` workload."""
    work = Workload(num_keys)
    gc.collect()
    tracemalloc.start()
    kept = build(work)
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del kept
    return grown / work.num_keys


def build_in_memory(work: Workload) -> InMemoryIndex:
    index = InMemoryIndex(pod_cache_size=PODS)
    work.fill_index(index)
    return index


def build_kvbm(work: Workload) -> OpalKVBM:
    kvbm = OpalKVBM()
    work.fill_kvbm(kvbm)
    return kvbm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench/bench_index.json"))
    parser.add_argument("--keys", type=int, default=2**20, help="background request keys, InMemoryIndex")
    parser.add_argument("--redis-keys", type=int, default=2**20, help="background request keys, RedisIndex")
    parser.add_argument("--memory-keys", type=int, default=2**17, help="keys of the tracemalloc builds")
    parser.add_argument("--ingest-events", type=int, default=4096)
    parser.add_argument("--lookup-seconds", type=float, default=2.0)
    args = parser.parse_args()
    started = time.perf_counter()

    events = ingest_events(args.ingest_events)
    in_memory = run("InMemoryIndex", InMemoryIndex(pod_cache_size=PODS), args.keys, events, args.lookup_seconds)
    gc.collect()
    with LocalRedisServer() as server, RedisIndex(server.url, namespace="bench:") as index:
        redis_version = index.client.info("server")["redis_version"]
        on_redis = run("RedisIndex", index, args.redis_keys, events, args.lookup_seconds,
                    memory_probe=lambda: index.client.info("memory")["used_memory"])
    memory_bytes = traced_bytes_per_key(args.memory_keys, build_in_memory)
    anchor_bytes = traced_bytes_per_key(args.memory_keys, build_kvbm)
    in_memory["kvlab"]["bytes_per_key"] = memory_bytes
    in_memory["opal_kvbm"]["bytes_per_key"] = anchor_bytes
    in_memory["memory_measured_at_keys"] = Workload(args.memory_keys).num_keys
    in_memory["ratio_bytes_per_key"] = memory_bytes / anchor_bytes
    on_redis["opal_kvbm"]["bytes_per_key"] = anchor_bytes
    on_redis["ratio_bytes_per_key"] = on_redis["kvlab"]["bytes_per_key"] / anchor_bytes
    on_redis["redis_server"] = f"redis-server {redis_version}, loopback, no persistence"
    on_redis["scaled_down"] = args.redis_keys < 2**20

    report = {
        "benchmark": "bench_index",
        "anchor": "Opal KVBM as plain dicts of sets (worker -> chunks, chunk -> workers; in this file): no engine "
                  "keys, tiers or entry objects; its lookup hands back the live worker sets, unsorted",
        "workload": {"pods": PODS, "blocks_per_store": BLOCKS_PER_STORE, "tokens_per_block": TOKENS_PER_BLOCK,
                     "lookup_request_blocks": REQUEST_BLOCKS, "lookup": "all pods, stop at the first miss",
                     "request_depth_of_pod_p_blocks": "2 * (p + 1)", "in_memory_pod_cache_size": PODS,
                     "ingest": "EventIngestor, one 16-block BlockStored per batch, chained per pod, hashed "
                               "with llm-d's hasher (the anchor hashes the same events)",
                     "bytes_per_key": "tracemalloc (Python, memory_measured_at_keys), INFO used_memory (Redis)"},
        "machine": machine_info(),
        "targets": {},
        "met": {},
        "results": {"in_memory": in_memory, "redis": on_redis},
        "seconds": time.perf_counter() - started,
    }
    write_report(args.out, report)
    for name, res in (("InMemoryIndex", in_memory), ("RedisIndex", on_redis)):
        k, a = res["kvlab"], res["opal_kvbm"]
        print(f"{name:13s} {res['keys']:>9,} keys  add {k['add_stores_per_s']:9,.0f} stores/s "
              f"({res['ratio_add_stores_per_s']:.3f}x KVBM)  ingest {k['ingest_events_per_s']:7,.0f} events/s "
              f"({res['ratio_ingest_events_per_s']:.2f}x)  lookup {k['lookups_per_s']:7,.0f}/s "
              f"({res['ratio_lookups_per_s']:.3f}x)  {k['bytes_per_key']:.0f} B/key ({res['ratio_bytes_per_key']:.1f}x"
              f" KVBM's {a['bytes_per_key']:.0f})")
    print(f"no target set (report); {report['seconds']:.0f} s -> {args.out}")


if __name__ == "__main__":
    main()
