"""Hashing speed, each kvlab hash beside its anchor in one process (CPU time, interleaved).

1. vLLM ``sha256`` profile (``kvlab.hashing.vllm``) on a 128k-token prompt at B=16 vs a bare
   chained ``hashlib.sha256`` loop over the same pre-serialised block bytes. Target: ≥ 3×
   for ``block_hashes`` (a list of 32-byte ``bytes``, as the loop returns; the profile
   serialises and hashes in one numba kernel through the CPU's SHA extensions or
   libcrypto, ``engine`` in the JSON). ``block_hash_array`` (one ``uint8[n, 32]`` array, no
   Python object per block) is reported beside it. Also reported as a fraction of
   ``openssl speed -evp sha256 -bytes N`` at N = the mean serialised block size (OpenSSL
   hashing N-byte messages through its EVP interface) and of the SHA-256 compression rate
   (``openssl speed`` at 16 KiB, divided by the 64-byte chunks each block's padded
   message takes): the machine's limit. The same for ``sha256_cbor`` (canonical CBOR,
   written by a kernel too) against a bare loop over the ``cbor2`` bytes.
2. ``chain_u64`` (kvlab's numba simulation hash) on the same prompt vs a chained
   ``xxhash.xxh3_64`` loop over the blocks' token bytes. Target: ≥ 3×.
3. ``chain_u64_batch`` over 100,000 prompts of 100–2,000 tokens (CSR in and out), B=16, vs
   one ``xxhash.xxh3_64`` call over all the prompts' token bytes (the ``int64`` array
   ``chain_u64_batch`` reads): the machine's limit for hashing those bytes once. Target:
   ≥ 0.5×. The per-prompt ``chain_u64`` loop a caller wrote before is reported too.

The vLLM pair must produce the same digests, the batch the same keys as per-prompt calls
(checked on a sample). Each JSON records the load average before and after. Usage:
``python benchmarks/bench_hashing.py --out out/bench/bench_hashing.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pickle
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import cbor2
import numpy as np
import xxhash

from kvlab.hashing import chain_u64, chain_u64_batch, vllm
from kvlab.hashing.digests import DEFAULT_NONE_HASH_SEED, none_hash
from kvlab.hashing.sha_ni import sha256_engine
from report import exit_unless_met, machine_info, write_report  # noqa: E402 - benchmarks/ is on sys.path

PROMPT_TOKENS = 131_072
BLOCK_SIZE = 16
NUM_PROMPTS = 100_000
PROMPT_LENGTHS = (100, 2_000)
TARGET_VLLM_VS_HASHLIB = 3.0
TARGET_CHAIN_VS_XXH3 = 3.0
TARGET_BATCH_VS_XXH3 = 0.5


def serialised_blocks(tokens: list[int], algo: str = "sha256") -> list[tuple[bytes, bytes]]:
    """vLLM's serialised block payloads (pickle, or canonical CBOR for ``sha256_cbor``),
    split around the parent hash (built beforehand)."""
    dummy = b"\0" * 32
    parts = []
    for i in range(0, len(tokens) - BLOCK_SIZE + 1, BLOCK_SIZE):
        payload = (dummy, tuple(tokens[i:i + BLOCK_SIZE]), None)
        data = cbor2.dumps(payload, canonical=True) if algo == "sha256_cbor" else pickle.dumps(payload, protocol=5)
        cut = data.index(dummy)
        parts.append((data[:cut], data[cut + 32:]))
    return parts


def sha256_loop(parts: list[tuple[bytes, bytes]], algo: str = "sha256") -> Callable[[], list[bytes]]:
    """A bare chained sha256 loop over vLLM's serialised block bytes."""
    root = none_hash(algo, DEFAULT_NONE_HASH_SEED)

    def run() -> list[bytes]:
        h, out = root, []
        for prefix, suffix in parts:
            h = hashlib.sha256(prefix + h + suffix).digest()
            out.append(h)
        return out

    return run


def openssl_sha256(message_bytes: int) -> dict[str, object]:
    """``openssl speed -evp sha256 -bytes N`` (1 s, CPU time): bytes/s and messages/s,
    or the reason it could not run."""
    cmd = ["openssl", "speed", "-evp", "sha256", "-seconds", "1", "-bytes", str(message_bytes)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return {"command": " ".join(cmd), "error": str(exc)}
    match = re.search(r"^sha256\s+([\d.]+)k\s*$", out, re.MULTILINE)
    if match is None:
        return {"command": " ".join(cmd), "error": f"unparsed output: {out[-200:]!r}"}
    bytes_per_s = float(match.group(1)) * 1000
    return {"command": " ".join(cmd), "bytes_per_s": bytes_per_s, "messages_per_s": bytes_per_s / message_bytes}


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


def interleaved_best(sides: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Best CPU time (``time.process_time``, s) of each side, the sides taking turns."""
    best = dict.fromkeys(sides, float("inf"))
    for _ in range(repeats):
        for name, fn in sides.items():
            start = time.process_time()
            fn()
            best[name] = min(best[name], time.process_time() - start)
    return best


def bench_vllm(tokens: np.ndarray, repeats: int, algo: str = "sha256") -> dict[str, object]:
    hasher = vllm(algo=algo, block_size=BLOCK_SIZE)
    parts = serialised_blocks(tokens.tolist(), algo)
    limit = sha256_loop(parts, algo)
    if hasher.block_hashes(tokens) != limit():
        raise AssertionError(f"vLLM {algo} profile and the bare sha256 loop disagree")
    if [bytes(row) for row in hasher.block_hash_array(tokens)] != limit():
        raise AssertionError(f"vLLM {algo} block_hash_array and the bare sha256 loop disagree")
    t = interleaved_best({"kvlab": lambda: hasher.block_hashes(tokens),
                          "kvlab_array": lambda: hasher.block_hash_array(tokens), "hashlib": limit}, repeats)
    num_blocks = len(parts)
    lengths = [len(p) + 32 + len(s) for p, s in parts]
    message_bytes = round(sum(lengths) / num_blocks)
    chunks_per_block = sum((n + 9 + 63) // 64 for n in lengths) / num_blocks
    openssl, bulk = openssl_sha256(message_bytes), openssl_sha256(16384)
    rates = {side: num_blocks / t[side] for side in ("kvlab", "kvlab_array")}
    compression_limit = bulk["bytes_per_s"] / 64 / chunks_per_block if "bytes_per_s" in bulk else None
    return {"pair": f"vllm.{algo} profile vs bare chained hashlib.sha256 loop", "blocks": num_blocks,
            "engine": sha256_engine(),
            "kvlab_blocks_per_s": rates["kvlab"], "kvlab_array_blocks_per_s": rates["kvlab_array"],
            "anchor_blocks_per_s": num_blocks / t["hashlib"],
            "ratio": t["hashlib"] / t["kvlab"], "ratio_array": t["hashlib"] / t["kvlab_array"],
            "target": TARGET_VLLM_VS_HASHLIB,
            "mean_block_bytes": message_bytes, "chunks_per_block": chunks_per_block,
            "openssl": openssl, "openssl_16k": bulk,
            "fraction_of_openssl": rates["kvlab"] / openssl["messages_per_s"] if "messages_per_s" in openssl else None,
            "fraction_of_openssl_array": (rates["kvlab_array"] / openssl["messages_per_s"]
                                          if "messages_per_s" in openssl else None),
            "compression_limit_blocks_per_s": compression_limit,
            "fraction_of_compression_limit": rates["kvlab"] / compression_limit if compression_limit else None,
            "fraction_of_compression_limit_array": (rates["kvlab_array"] / compression_limit
                                                    if compression_limit else None)}


def bench_chain(tokens: np.ndarray, repeats: int) -> dict[str, object]:
    num_blocks = PROMPT_TOKENS // BLOCK_SIZE
    chain_u64(tokens, BLOCK_SIZE)  # compile outside the timing
    t = interleaved_best({"kvlab": lambda: chain_u64(tokens, BLOCK_SIZE),
                          "xxh3": xxh3_loop(tokens.astype("<u4").tobytes(), num_blocks)}, repeats)
    return {"pair": "chain_u64 vs chained xxhash.xxh3_64 loop", "blocks": num_blocks,
            "kvlab_blocks_per_s": num_blocks / t["kvlab"], "anchor_blocks_per_s": num_blocks / t["xxh3"],
            "ratio": t["xxh3"] / t["kvlab"], "target": TARGET_CHAIN_VS_XXH3}


def bench_batch(rng: np.random.Generator, repeats: int) -> dict[str, object]:
    lengths = rng.integers(PROMPT_LENGTHS[0], PROMPT_LENGTHS[1] + 1, size=NUM_PROMPTS)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = rng.integers(0, 152_064, size=int(offsets[-1])).astype(np.int64)
    key_offsets, keys = chain_u64_batch(offsets, tokens, BLOCK_SIZE)  # compiles
    for r in range(0, NUM_PROMPTS, NUM_PROMPTS // 100):
        if keys[key_offsets[r]:key_offsets[r + 1]].tolist() != chain_u64(tokens[offsets[r]:offsets[r + 1]],
                                                                          BLOCK_SIZE).tolist():
            raise AssertionError(f"chain_u64_batch differs from chain_u64 on prompt {r}")
    data = memoryview(tokens).cast("B")  # the int64 array chain_u64_batch reads, no copy
    t = interleaved_best({"kvlab": lambda: chain_u64_batch(offsets, tokens, BLOCK_SIZE),
                          "xxh3": lambda: xxhash.xxh3_64_intdigest(data)}, repeats)
    per_prompt = interleaved_best({"loop": lambda: [chain_u64(tokens[offsets[r]:offsets[r + 1]], BLOCK_SIZE)
                                                    for r in range(NUM_PROMPTS)]}, 1)["loop"]
    num_tokens = int(offsets[-1])
    return {"pair": "chain_u64_batch vs one xxhash.xxh3_64 call over the same bytes", "prompts": NUM_PROMPTS,
            "tokens": num_tokens, "blocks": len(keys), "bytes": tokens.nbytes,
            "kvlab_tokens_per_s": num_tokens / t["kvlab"], "anchor_tokens_per_s": num_tokens / t["xxh3"],
            "per_prompt_chain_u64_tokens_per_s": num_tokens / per_prompt,
            "per_prompt_chain_u64_us_per_prompt": per_prompt / NUM_PROMPTS * 1e6,
            "ratio": t["xxh3"] / t["kvlab"], "target": TARGET_BATCH_VS_XXH3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench/bench_hashing.json"))
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    load_before = os.getloadavg()
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 152_064, size=PROMPT_TOKENS).astype(np.int64)  # a Qwen-sized vocabulary
    results = [bench_vllm(tokens, args.repeats), bench_vllm(tokens, args.repeats, "sha256_cbor"),
               bench_chain(tokens, args.repeats), bench_batch(rng, args.repeats)]
    met = {name: r["ratio"] >= r["target"]
           for name, r in zip(("vllm_sha256_vs_hashlib", "vllm_sha256_cbor_vs_hashlib", "chain_u64_vs_xxh3_loop",
                               "chain_u64_batch_vs_xxh3"), results, strict=True)}
    report = {
        "benchmark": "bench_hashing", "prompt_tokens": PROMPT_TOKENS, "block_size": BLOCK_SIZE,
        "clock": "time.process_time, sides interleaved, best of repeats", "repeats": args.repeats,
        "machine": machine_info(), "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "met": met, "results": results,
    }
    write_report(args.out, report)
    for r in results:
        unit = "tokens" if "kvlab_tokens_per_s" in r else "blocks"
        print(f"{r['pair']:<64} kvlab {r[f'kvlab_{unit}_per_s'] / 1e6:8.2f} M {unit}/s  anchor "
              f"{r[f'anchor_{unit}_per_s'] / 1e6:8.2f} M/s  ratio {r['ratio']:5.2f} (target {r['target']})")
    for row in results[:2]:
        name = row["pair"].split()[0]
        print(f"{name}: engine {row['engine']}, block_hash_array "
              f"{row['kvlab_array_blocks_per_s'] / 1e6:.2f} M blocks/s (ratio {row['ratio_array']:.2f})")
        if row["fraction_of_openssl"] is not None:
            print(f"{name}: {row['fraction_of_openssl']:.2f}x (array {row['fraction_of_openssl_array']:.2f}x) "
                  f"openssl speed -evp sha256 at {row['mean_block_bytes']} bytes "
                  f"({row['openssl']['messages_per_s'] / 1e6:.2f} M msgs/s)")
        if row["fraction_of_compression_limit"] is not None:
            print(f"{name}: {row['fraction_of_compression_limit']:.2f}x (array "
                  f"{row['fraction_of_compression_limit_array']:.2f}x) the SHA-256 compression limit "
                  f"({row['compression_limit_blocks_per_s'] / 1e6:.2f} M blocks/s at {row['chunks_per_block']:.2f} "
                  "chunks per block, openssl at 16 KiB)")
    print(f"load average before {load_before}, after {report['load_average_after']}")
    exit_unless_met(met, args.out)


if __name__ == "__main__":
    main()
