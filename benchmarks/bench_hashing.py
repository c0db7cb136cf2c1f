"""Hashing speed on a 128k-token prompt at B=16, each profile beside its anchor.

1. vLLM ``sha256`` profile (``kvlab.hashing.vllm``) vs a bare chained ``hashlib.sha256``
   loop over the same pre-serialised block bytes — the machine's limit for these bytes.
   Target: ≥ 0.8× the limit.
2. ``chain_u64`` (kvlab's numba simulation hash) vs a chained ``xxhash.xxh3_64`` loop over
   the blocks' token bytes. Target: ≥ 3×.

Both sides of each pair hash the same prompt in one run; the vLLM pair must produce the
same digests. Usage: ``python benchmarks/bench_hashing.py --out out/bench/bench_hashing.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import xxhash

from kvlab.hashing import chain_u64, vllm
from kvlab.hashing.digests import DEFAULT_NONE_HASH_SEED, none_hash
from report import best_of, exit_unless_met, machine_info, write_report  # noqa: E402 - benchmarks/ is on sys.path

PROMPT_TOKENS = 131_072
BLOCK_SIZE = 16
TARGET_VLLM_VS_LIMIT = 0.8
TARGET_CHAIN_VS_XXH3 = 3.0


def sha256_limit_loop(tokens: list[int]) -> tuple[callable, callable]:
    """A bare chained sha256 loop over vLLM's serialised block bytes (built beforehand)."""
    dummy = b"\0" * 32
    parts = []
    for i in range(0, len(tokens) - BLOCK_SIZE + 1, BLOCK_SIZE):
        data = pickle.dumps((dummy, tuple(tokens[i:i + BLOCK_SIZE]), None), protocol=5)
        cut = data.index(dummy)
        parts.append((data[:cut], data[cut + 32:]))
    root = none_hash("sha256", DEFAULT_NONE_HASH_SEED)

    def run() -> list[bytes]:
        h, out = root, []
        for prefix, suffix in parts:
            h = hashlib.sha256(prefix + h + suffix).digest()
            out.append(h)
        return out

    return run


def xxh3_loop(token_bytes: bytes, num_blocks: int) -> Callable[[], int]:
    """A chained xxh3_64 loop over the blocks' u32 token bytes."""
    width = BLOCK_SIZE * 4
    blocks = [token_bytes[i * width:(i + 1) * width] for i in range(num_blocks)]

    def run() -> int:
        h = 0
        for block in blocks:
            h = xxhash.xxh3_64_intdigest(h.to_bytes(8, "little") + block)
        return h

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench/bench_hashing.json"))
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 152_064, size=PROMPT_TOKENS).astype(np.int64)  # a Qwen-sized vocabulary
    num_blocks = PROMPT_TOKENS // BLOCK_SIZE
    hasher = vllm(algo="sha256", block_size=BLOCK_SIZE)
    limit = sha256_limit_loop(tokens.tolist())
    if hasher.block_hashes(tokens) != limit():
        raise AssertionError("vLLM profile and the bare sha256 loop disagree")
    profile_s = best_of(lambda: hasher.block_hashes(tokens), args.repeats)
    limit_s = best_of(limit, args.repeats)

    chain_u64(tokens, BLOCK_SIZE)  # compile outside the timing
    chain_s = best_of(lambda: chain_u64(tokens, BLOCK_SIZE), args.repeats)
    xxh3_s = best_of(xxh3_loop(tokens.astype("<u4").tobytes(), num_blocks), args.repeats)

    results = [
        {"pair": "vllm.sha256 profile vs bare chained hashlib.sha256 loop", "blocks": num_blocks,
         "kvlab_blocks_per_s": num_blocks / profile_s, "anchor_blocks_per_s": num_blocks / limit_s,
         "ratio": limit_s / profile_s, "target": TARGET_VLLM_VS_LIMIT},
        {"pair": "chain_u64 vs chained xxhash.xxh3_64 loop", "blocks": num_blocks,
         "kvlab_blocks_per_s": num_blocks / chain_s, "anchor_blocks_per_s": num_blocks / xxh3_s,
         "ratio": xxh3_s / chain_s, "target": TARGET_CHAIN_VS_XXH3},
    ]
    report = {
        "benchmark": "bench_hashing", "prompt_tokens": PROMPT_TOKENS, "block_size": BLOCK_SIZE,
        "machine": machine_info(),
        "met": all(r["ratio"] >= r["target"] for r in results),
        "results": results,
    }
    write_report(args.out, report)
    for r in results:
        print(f"{r['pair']:<58} kvlab {r['kvlab_blocks_per_s'] / 1e6:6.2f} M blocks/s  anchor "
              f"{r['anchor_blocks_per_s'] / 1e6:6.2f} M/s  ratio {r['ratio']:5.2f} (target {r['target']})")
    exit_unless_met(report["met"], args.out)


if __name__ == "__main__":
    main()
