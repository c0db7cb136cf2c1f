"""What notebook 02 teaches about block hashing, across the engines' profiles: chaining makes equal keys
mean equal prefixes, the profiles never share a key, and a router at another block size matches nothing."""

from __future__ import annotations

import numpy as np

from kvlab import hashing

PROMPT = np.random.default_rng(0).integers(0, 32_000, size=100).tolist()
PROFILES = {
    "vllm.sha256": hashing.vllm("sha256", block_size=16),
    "vllm.sha256_cbor": hashing.vllm("sha256_cbor", block_size=16),
    "llmd": hashing.llmd(block_size=16, model_name="Qwen/Qwen3-8B"),
    "dynamo": hashing.dynamo(block_size=16),
    "lmcache (mp, blake3)": hashing.lmcache(chunk_size=16, mode="mp_token_hasher"),
    "sglang": hashing.sglang(page_size=16),
}


def test_keys_agree_exactly_on_the_shared_full_blocks() -> None:
    vllm16 = hashing.vllm(block_size=16)
    other = PROMPT[:40] + [t + 1 for t in PROMPT[40:]]  # shares tokens 0-39: blocks 0 and 1 only
    equal = (vllm16.block_keys(PROMPT) == vllm16.block_keys(other)).tolist()
    assert equal == [True, True] + [False] * 4  # 6 full blocks of 16 (the 4-token tail is not hashed)


def test_one_changed_token_in_block_0_changes_every_key() -> None:
    vllm16 = hashing.vllm(block_size=16)
    changed = list(PROMPT)
    changed[3] += 1
    assert (vllm16.block_keys(PROMPT) != vllm16.block_keys(changed)).all()


def test_the_profiles_never_share_a_key() -> None:
    keys = {name: set(h.block_keys(PROMPT).tolist()) for name, h in PROFILES.items()}
    assert all(len(k) >= 6 for k in keys.values())
    assert all(not keys[a] & keys[b] for a in keys for b in keys if a < b)


def test_only_a_router_at_the_engines_block_size_matches() -> None:
    tokens = np.random.default_rng(1).integers(0, 32_000, size=1024).tolist()
    engine = set(hashing.dynamo(block_size=64).local_block_hashes(tokens))
    matching = {b: len(set(hashing.dynamo(block_size=b).local_block_hashes(tokens)) & engine)
                for b in (16, 32, 64, 128)}
    assert matching == {16: 0, 32: 0, 64: 16, 128: 0}


def test_the_last_token_rule() -> None:
    vllm16 = hashing.vllm(block_size=16)
    assert [vllm16.max_cache_hit_tokens(n) for n in (16, 17, 32, 33)] == [0, 16, 16, 32]


def test_extras_split_the_cache_where_they_start() -> None:
    """LoRA touches every block, the cache salt the first one; an image at tokens 50-69 the blocks from
    the one holding token 50 (block 3, tokens 48-63): the keys agree up to there."""
    from kvlab.hashing import MMItem, RequestExtras

    vllm16 = hashing.vllm(block_size=16)
    plain = vllm16.block_keys(PROMPT)
    variants = {"lora": RequestExtras(lora_name="support-v1", lora_path="/adapters/support-v1"),
                "salt": RequestExtras(cache_salt="tenant-b"),
                "image": RequestExtras(mm_items=(MMItem("f9a38a66df90291515d7ea4de3175b26" * 2, 50, 20),))}
    shared = {name: int(np.cumprod(vllm16.block_keys(PROMPT, extras) == plain).sum())
              for name, extras in variants.items()}
    assert shared == {"lora": 0, "salt": 0, "image": 3}
