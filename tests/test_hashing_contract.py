"""One contract over every hashing profile, and the registry."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab import hashing
from kvlab.hashing import PROFILES, BlockHasher, get_hasher

BLOCK = 4
MAKERS = {
    "vllm.sha256": lambda: hashing.vllm(block_size=BLOCK),
    "vllm.sha256_cbor": lambda: hashing.vllm("sha256_cbor", block_size=BLOCK),
    "vllm.xxhash": lambda: hashing.vllm("xxhash", seed="0", block_size=BLOCK),
    "llmd": lambda: hashing.llmd(block_size=BLOCK, model_name="m"),
    "dynamo": lambda: hashing.dynamo(BLOCK),
    "lmcache.chunked": lambda: hashing.lmcache(BLOCK, algo="sha256_cbor", save_unfull_chunk=True),
    "lmcache.mp": lambda: hashing.lmcache(BLOCK, mode="mp_token_hasher"),
    "sglang": lambda: hashing.sglang(BLOCK),
    "sim": lambda: hashing.sim(BLOCK, seed=1),
}
tokens_st = st.lists(st.integers(0, 2**31 - 1), max_size=30)


@pytest.mark.parametrize("name", sorted(MAKERS))
@given(tokens=tokens_st, cut=st.integers(0, 30))
def test_profile_contract(name, tokens, cut) -> None:
    """u64 keys, one per hashed block, deterministic, and chained: a prompt's prefix keeps
    the keys of its full blocks."""
    hasher = MAKERS[name]()
    assert isinstance(hasher, BlockHasher)
    keys = hasher.block_keys(tokens)
    assert keys.dtype == np.uint64 and len(keys) == hasher.num_hashed_blocks(len(tokens))
    assert keys.tolist() == [hasher.to_u64(h) for h in hasher.block_hashes(tokens)]
    assert np.array_equal(keys, MAKERS[name]().block_keys(tokens))
    prefix = tokens[:cut]
    full = len(prefix) // BLOCK
    assert np.array_equal(hasher.block_keys(prefix)[:full], keys[:full])


def test_engines_never_share_keys_on_the_same_prompt() -> None:
    tokens = list(range(1000, 1064))
    seen: dict[int, str] = {}
    for name, make in MAKERS.items():
        for key in make().block_keys(tokens).tolist():
            assert key not in seen or seen[key] == name, (name, seen.get(key))
            seen[key] = name


def test_get_hasher() -> None:
    assert sorted(PROFILES) == ["dynamo", "llmd", "lmcache", "sglang", "sim", "vllm"]
    assert get_hasher("dynamo", block_size=64).block_size == 64
    with pytest.raises(ValueError, match=r"profile must be one of \('dynamo', 'llmd', 'lmcache', 'sglang', 'sim', "
                                         r"'vllm'\), got 'mooncake'"):
        get_hasher("mooncake")
    with pytest.raises(ValueError, match="profile 'sglang': .*unexpected keyword argument 'block_size'"):
        get_hasher("sglang", block_size=4)
    with pytest.raises(ValueError, match="block_size must be an integer >= 1, got 0"):
        get_hasher("vllm", block_size=0)
