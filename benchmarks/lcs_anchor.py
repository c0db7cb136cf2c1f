"""libCacheSim as a benchmark anchor: the same block stream, replayed by its C simulator.

libCacheSim (PyPI ``libcachesim``, GPL) is an optional ``bench`` extra, never a kvlab
dependency. The trace's block references are written once, in access order (forward:
kvlab's ``touch_order="tail_most_recent"``), as libCacheSim's ``oracleGeneral`` binary
records (u32 time, u64 object id, u32 size = 1, i64 next access); a cache of ``C``
bytes then holds ``C`` blocks. Not part of kvlab.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from kvlab.traces import Trace

try:
    import libcachesim
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise SystemExit("libcachesim is missing: `make bench` installs it (pip install -e '.[bench]')") from err

#: kvlab policy name -> libCacheSim class name.
LCS_CLASSES = {"lru": "LRU", "fifo": "FIFO", "s3fifo": "S3FIFO", "sieve": "Sieve", "arc": "ARC", "lfu": "LFU",
               "belady": "Belady"}


def write_oracle_general(trace: Trace, path: Path) -> Path:
    """Write ``trace``'s block ids in flat order as an oracleGeneral binary trace
    (:func:`write_oracle_ids` of its dense ids)."""
    return write_oracle_ids(trace.flat.block_ids, path)


def write_oracle_ids(ids: np.ndarray, path: Path) -> Path:
    """Write object ids ``ids`` (any integers, in access order) as an oracleGeneral binary trace.

    The next-access field (needed by libCacheSim's Belady) is the index of the next
    reference to the same object, or -1.
    """
    ids = np.asarray(ids).astype(np.int64)
    n = ids.shape[0]
    order = np.argsort(ids, kind="stable")  # references grouped by block, in time order
    nxt = np.full(n, -1, dtype=np.int64)
    same = ids[order[1:]] == ids[order[:-1]]
    nxt[order[:-1][same]] = order[1:][same]
    records = np.zeros(n, dtype=[("time", "<u4"), ("id", "<u8"), ("size", "<u4"), ("next", "<i8")])
    records["time"] = np.arange(n, dtype=np.uint32)
    records["id"] = ids.astype(np.uint64)
    records["size"] = 1
    records["next"] = nxt
    records.tofile(path)
    return path


def replay_lcs(path: Path, policy: str, capacity_blocks: int) -> tuple[float, float]:
    """Run one libCacheSim cache over the file; returns (miss ratio, seconds)."""
    reader = libcachesim.TraceReader(trace=str(path), trace_type=libcachesim.TraceType.ORACLE_GENERAL_TRACE)
    cache = getattr(libcachesim, LCS_CLASSES[policy])(cache_size=capacity_blocks)
    start = time.perf_counter()
    miss_ratio, _ = cache.process_trace(reader)
    return float(miss_ratio), time.perf_counter() - start
