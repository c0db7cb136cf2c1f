"""CacheBlend chunk matching speed: kvlab's TokenRangeMatcher beside a plain-Python dictionary of windows.

State: ``--chunks`` registered chunks (default 1,000,000) of ``--chunk-size`` tokens (default
256, LMCache's chunk: 256 M random ``uint32`` token ids, 1 GiB as the source array plus 1 GiB
kept by the matcher for its exact comparison), registered ``--batch-chunks`` at a time (a
``register`` call per stored sequence, at its position offset).

Queries of ``--query-tokens`` tokens (default 131,072): ``mixed`` is stored chunks at
unaligned offsets between random fillers of 0-255 tokens (the chunks come from the anchor's
subset, so both matchers must return the same matches; about 340 hits), ``miss`` is random
tokens only. ``match`` is timed end to end (token checks, the numba rolling hash over every
window and the probe, the ``BlendMatch`` list), best of ``--repeats``; ``strided`` is the
same mixed query probed at every 16th position (B19's block-aligned probe).

Anchor (in this file): a dict from ``tuple(chunk tokens)`` to (storage key, stored
position), probed with every window of the query, first occurrence per key: the obvious
plain-Python matcher. Holding 1 M tuples of 256 Python ints would take ~10 GB, so it holds
``--anchor-chunks`` of them (default 65,536); a dict probe does not depend much on its size,
and the query uses only those chunks. Its registration rate is measured on that subset.

Target: ``match`` >= 50 M query tokens/s on both queries against 1 M registered chunks of
256 tokens. Usage: ``python benchmarks/bench_blend.py --out out/bench/bench_blend.json``.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np

from kvlab.blend import BlendMatch, TokenRangeMatcher

sys.path.insert(0, str(Path(__file__).parent))
from report import best_of, exit_unless_met, machine_info, write_report  # noqa: E402 - benchmarks/ is on sys.path

TARGET_QUERY_TOKENS_PER_S = 50e6
BLOCK_TOKENS = 16  # the engine block of the strided probe (vLLM's usual block size)


class DictOfWindows:
    """The anchor: ``tuple(chunk) -> (key, start)``; a query probes every window, first occurrence per key."""

    def __init__(self, chunk_size: int) -> None:
        self.k = chunk_size
        self.windows: dict[tuple[int, ...], tuple[int, int]] = {}

    def register(self, chunks: list[list[int]], keys: list[int], starts: list[int]) -> None:
        for tokens, key, start in zip(chunks, keys, starts):
            self.windows[tuple(tokens)] = (key, start)

    def match(self, query: list[int]) -> list[tuple[int, int, int]]:
        """``(cur_st, old_st, key)`` per stored chunk at its first occurrence, by ``cur_st``."""
        k, windows, seen, out = self.k, self.windows, set(), []
        for pos in range(len(query) - k + 1):
            hit = windows.get(tuple(query[pos:pos + k]))
            if hit is not None and hit[0] not in seen:
                seen.add(hit[0])
                out.append((pos, hit[1], hit[0]))
        return out


def mixed_query(tokens: np.ndarray, chunk_size: int, pool: np.ndarray, num_tokens: int,
                rng: np.random.Generator) -> np.ndarray:
    """Stored chunks (rows of ``pool``) between random fillers of 0..chunk_size-1 tokens, cut to ``num_tokens``."""
    parts, total = [], 0
    while total < num_tokens:
        filler = rng.integers(0, 2**32, size=int(rng.integers(0, chunk_size)), dtype=np.uint32)
        row = int(rng.choice(pool))
        parts += [filler, tokens[row * chunk_size:(row + 1) * chunk_size]]
        total += filler.shape[0] + chunk_size
    return np.concatenate(parts)[:num_tokens]


def triples(matches: list[BlendMatch]) -> list[tuple[int, int, int]]:
    return [(m.cur_st, m.old_st, m.storage_key) for m in matches]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench/bench_blend.json"))
    parser.add_argument("--chunks", type=int, default=1_000_000)
    parser.add_argument("--chunk-size", type=int, default=256)
    parser.add_argument("--batch-chunks", type=int, default=1024)
    parser.add_argument("--query-tokens", type=int, default=131_072)
    parser.add_argument("--anchor-chunks", type=int, default=65_536)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    k, num_chunks, batch = args.chunk_size, args.chunks, args.batch_chunks
    rng = np.random.default_rng(0)

    tokens = rng.integers(0, 2**32, size=num_chunks * k, dtype=np.uint32)
    keys = rng.integers(0, 2**63, size=num_chunks, dtype=np.int64).astype(np.uint64)
    warm = TokenRangeMatcher(k)  # compile the kernels outside the timings
    warm.register(tokens[:2 * k], keys[:2])
    warm.match(tokens[:4 * k])

    matcher = TokenRangeMatcher(k)
    start = time.perf_counter()
    for first in range(0, num_chunks, batch):
        last = min(first + batch, num_chunks)
        matcher.register(tokens[first * k:last * k], keys[first:last], position_offset=first * k)
    register_s = time.perf_counter() - start
    assert len(matcher) == num_chunks

    subset = np.sort(rng.choice(num_chunks, size=min(args.anchor_chunks, num_chunks), replace=False))
    anchor = DictOfWindows(k)
    rows = tokens.reshape(num_chunks, k)[subset].tolist()
    start = time.perf_counter()
    anchor.register(rows, keys[subset].tolist(), (subset * k).tolist())
    anchor_register_s = time.perf_counter() - start

    queries = {"mixed": mixed_query(tokens, k, subset, args.query_tokens, rng),
               "miss": rng.integers(0, 2**32, size=args.query_tokens, dtype=np.uint32)}
    results = []
    for name, query in queries.items():
        got = matcher.match(query)
        query_list = query.tolist()
        start = time.perf_counter()
        expected = anchor.match(query_list)
        anchor_s = time.perf_counter() - start
        if triples(got) != expected:
            raise AssertionError(f"{name}: kvlab and the dictionary of windows disagree")
        match_s = best_of(lambda q=query: matcher.match(q), args.repeats)
        strided_s = best_of(lambda q=query: matcher.match(q, align_tokens=BLOCK_TOKENS), args.repeats)
        n = query.shape[0]
        results.append({
            "query": name, "query_tokens": n, "matches": len(got),
            "strided_matches": len(matcher.match(query, align_tokens=BLOCK_TOKENS)),
            "match_s": match_s, "match_query_tokens_per_s": n / match_s,
            "strided_match_s": strided_s, "strided_query_tokens_per_s": n / strided_s,
            "anchor_match_s": anchor_s, "anchor_query_tokens_per_s": n / anchor_s,
            "ratio_match_vs_anchor": anchor_s / match_s,
        })
    registration = {
        "registered_chunks": num_chunks, "chunk_size_tokens": k, "registered_tokens": num_chunks * k,
        "batch_chunks": batch, "register_s": register_s, "register_chunks_per_s": num_chunks / register_s,
        "register_tokens_per_s": num_chunks * k / register_s, "table_slots": matcher.table_slots,
        "anchor_chunks": len(subset), "anchor_register_s": anchor_register_s,
        "anchor_register_chunks_per_s": len(subset) / anchor_register_s,
        "ratio_register_vs_anchor": (num_chunks / register_s) / (len(subset) / anchor_register_s),
        "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    full_size = num_chunks >= 1_000_000 and k == 256 and args.query_tokens >= 131_072
    report = {
        "benchmark": "bench_blend",
        "anchor": "plain-Python dict tuple(chunk tokens) -> (key, start), every query window probed "
                  f"(holds {len(subset):,} of the chunks: 1 M tuples of 256 ints would need ~10 GB)",
        "machine": machine_info(),
        "targets": {"match_query_tokens_per_s_128k_query_1M_chunks_of_256": TARGET_QUERY_TOKENS_PER_S},
        "met": {f"match_{r['query']}": full_size and r["match_query_tokens_per_s"] >= TARGET_QUERY_TOKENS_PER_S
                for r in results},
        "registration": registration,
        "results": results,
    }
    write_report(args.out, report)
    print(f"registered {num_chunks:,} chunks x {k} tokens in {register_s:.2f} s: "
          f"{registration['register_chunks_per_s'] / 1e3:,.0f} k chunks/s "
          f"({registration['ratio_register_vs_anchor']:.1f}x the dict of windows), {matcher.table_slots:,} slots, "
          f"max RSS {registration['max_rss_bytes'] / 2**30:.1f} GiB")
    for r in results:
        print(f"{r['query']:<6} {r['query_tokens']:,} tokens, {r['matches']} matches: match "
              f"{r['match_query_tokens_per_s'] / 1e6:6.1f} M tokens/s ({r['match_s'] * 1e3:.2f} ms), strided "
              f"{r['strided_query_tokens_per_s'] / 1e6:6.1f} M/s, dict of windows "
              f"{r['anchor_query_tokens_per_s'] / 1e6:5.2f} M/s, ratio {r['ratio_match_vs_anchor']:,.0f}x")
    exit_unless_met(report["met"], args.out)


if __name__ == "__main__":
    main()
