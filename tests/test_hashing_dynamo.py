"""Dynamo KV router hashing: every golden vector, salts, MM ids, block-size mismatch, media, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from kvlab.hashing.base import MMItem, RequestExtras
from kvlab.hashing.dynamo_hash import (
    DYNAMO_SEED,
    MEDIUM_TIERS,
    DynamoHasher,
    mm_hash_from_identifier,
    salted_seed,
    storage_tier_from_medium,
)

VECTORS = json.loads((Path(__file__).parent / "vectors" / "dynamo_block_hashes.json").read_text())["cases"]
HASH_CASES = [c for c in VECTORS if "token_ids" in c]


def extras_for(case: dict) -> RequestExtras:
    p = case["params"]
    return RequestExtras(lora_name=p.get("lora_name"), cache_salt=p.get("cache_namespace"))


def hasher_for(case: dict) -> DynamoHasher:
    return DynamoHasher(block_size=case["params"]["block_size"], is_eagle=case["params"].get("is_eagle", False))


def test_vector_file_has_all_cases() -> None:
    assert len(VECTORS) == 12 and len(HASH_CASES) == 11


@pytest.mark.parametrize("case", HASH_CASES, ids=[c["name"] for c in HASH_CASES])
def test_hash_vectors(case: dict) -> None:
    hasher, extras, mm = hasher_for(case), extras_for(case), case.get("block_mm_hashes")
    p, expected = case["params"], case["expected"]
    # "seed_used" is the salted seed of the local hashes; "seed" (upstream goldens) is the unsalted 1337.
    assert salted_seed(extras.lora_name, extras.cache_salt) == p.get("seed_used", p.get("seed"))
    local = hasher.local_block_hashes(case["token_ids"], extras, block_mm_hashes=mm)
    assert local == expected["local_block_hashes_u64"]
    # The chain seed is always 1337, also when the local hashes were salted.
    sequence = expected.get("sequence_hashes_u64_seed1337", expected.get("sequence_hashes_u64"))
    if sequence is not None:
        assert hasher.sequence_hashes(local) == sequence
        assert hasher.block_hashes(case["token_ids"], extras, block_mm_hashes=mm) == sequence
        if mm is None:  # block_keys takes no precomputed MM hashes
            assert hasher.block_keys(case["token_ids"], extras).tolist() == sequence
    assert len(local) == hasher.num_hashed_blocks(len(case["token_ids"]))


def test_mm_identifier_vector() -> None:
    (case,) = [c for c in VECTORS if c["scheme"] == "dynamo.mm_hash_from_vllm_identifier"]
    tagged = [mm_hash_from_identifier(x) for x in case["inputs"]]
    bare = [mm_hash_from_identifier(x, offset_tagged=False) for x in case["inputs"]]
    assert tagged == case["expected"]["mm_hash_u64_offset_tagged"]
    assert bare == case["expected"]["mm_hash_u64_bare_string"]


def test_mm_items_use_the_offset_tagged_rule_per_overlapped_block() -> None:
    hasher = DynamoHasher(block_size=4)
    items = (MMItem("img-a", offset=5, length=1), MMItem("f9a38a66df902915" + "0" * 48, offset=6, length=4))
    tokens = list(range(1, 14))
    per_block = [None, [xxhash.xxh3_64_intdigest(b"img-a"), 0xF9A38A66DF902915], [0xF9A38A66DF902915]]
    assert hasher.local_block_hashes(tokens, RequestExtras(mm_items=items)) == \
        hasher.local_block_hashes(tokens, block_mm_hashes=per_block)
    # mm_second_block_only: hashes [5, 3] are sorted ascending before hashing
    assert hasher.local_block_hashes(tokens[:12], block_mm_hashes=[None, [3, 5], None])[1] == 2388835428626005634


def test_block_mm_hashes_may_cover_the_partial_tail_block() -> None:
    hasher = DynamoHasher(block_size=4)
    tokens = list(range(1, 11))  # 2 full blocks + 2 tokens
    assert hasher.local_block_hashes(tokens, block_mm_hashes=[None, None, [9]]) == \
        hasher.local_block_hashes(tokens, block_mm_hashes=[None, []])


DIGEST_A = "f9a38a66df90291515d7ea4de3175b262c1da7668ad1cc32e3dbb98be86388ac"
DIGEST_B = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789ab88ac"  # same last 4 hex digits


def test_images_sharing_last_hex_digits_give_different_keys() -> None:
    hasher = DynamoHasher(block_size=4)
    keys = [hasher.block_hashes(list(range(12)), RequestExtras(mm_items=(MMItem(digest, 4, 4),)))
            for digest in (DIGEST_A, DIGEST_B)]
    assert keys[0][0] == keys[1][0]
    assert keys[0][1] != keys[1][1] and keys[0][2] != keys[1][2]


def test_router_and_engine_block_size_mismatch_gives_no_equal_local_hash() -> None:
    tokens = list(range(1000, 1512))
    router = DynamoHasher(block_size=32).local_block_hashes(tokens)
    engine = DynamoHasher(block_size=64).local_block_hashes(tokens)
    assert len(router) == 16 and len(engine) == 8
    assert not set(router) & set(engine)


@given(st.lists(st.integers(0, 2**32 - 1), min_size=8, max_size=40))
def test_local_hashes_are_position_independent(tokens: list[int]) -> None:
    hasher = DynamoHasher(block_size=4)
    whole = hasher.local_block_hashes(tokens)
    assert whole[1:] == hasher.local_block_hashes(tokens[4:])
    assert hasher.block_hashes(tokens)[0] == whole[0]


def test_salts_separate_every_block() -> None:
    hasher, tokens = DynamoHasher(block_size=4), list(range(16))
    variants = [RequestExtras(), RequestExtras(lora_name="a"), RequestExtras(cache_salt="a"),
                RequestExtras(lora_name="a", cache_salt="a")]
    hashes = [set(hasher.local_block_hashes(tokens, extras)) for extras in variants]
    assert sum(len(h) for h in hashes) == len(set().union(*hashes)) == 16
    assert hasher.local_block_hashes(tokens, RequestExtras(cache_salt="")) == hasher.local_block_hashes(tokens)


def test_salted_seed_wraps_and_values() -> None:
    assert salted_seed() == DYNAMO_SEED == 1337
    assert salted_seed(cache_namespace="ns") == 6982494792024450620
    assert salted_seed("my-lora", "ns") == 1363159986667970528
    assert salted_seed("my-lora") + xxhash.xxh3_64_intdigest(b"ns", seed=1) > 2**64  # the sum wrapped


def test_eagle_windows_overlap_by_one_token() -> None:
    hasher = DynamoHasher(block_size=4, is_eagle=True)
    assert hasher.num_hashed_blocks(9) == 2 and hasher.num_hashed_blocks(8) == 1 and hasher.num_hashed_blocks(0) == 0
    assert hasher.local_block_hashes([1, 2, 3, 4, 5])[0] == xxhash.xxh3_64_intdigest(
        b"".join(t.to_bytes(4, "little") for t in [1, 2, 3, 4, 5]), seed=1337)


def test_bare_identifier_equal_to_lora_name_is_not_an_mm_hash() -> None:
    assert mm_hash_from_identifier(DIGEST_A, offset_tagged=False, lora_name=DIGEST_A) is None
    assert mm_hash_from_identifier(DIGEST_A, offset_tagged=False, lora_name="other") == 0xF9A38A66DF902915
    assert mm_hash_from_identifier(DIGEST_A.upper(), offset_tagged=False) == 0xF9A38A66DF902915
    assert mm_hash_from_identifier(DIGEST_A, lora_name=DIGEST_A) == 0xF9A38A66DF902915  # tagged: lora not used
    assert mm_hash_from_identifier("") is None
    assert mm_hash_from_identifier("g" * 64) == xxhash.xxh3_64_intdigest(b"g" * 64)
    assert mm_hash_from_identifier("g" * 64, offset_tagged=False) is None


@pytest.mark.parametrize(("medium", "tier"), sorted(MEDIUM_TIERS.items()) + [(None, "Device")])
def test_storage_tier_from_medium(medium: str | None, tier: str) -> None:
    assert storage_tier_from_medium(medium) == tier


def test_medium_table_is_the_spec_table() -> None:
    by_tier: dict[str, set[str]] = {}
    for medium, tier in MEDIUM_TIERS.items():
        by_tier.setdefault(tier, set()).add(medium)
    assert by_tier == {"Device": {"GPU", "DEVICE"}, "HostPinned": {"CPU", "CPU_PINNED", "CPU_TIER1"},
                       "Disk": {"CPU_TIER2", "DISK", "NVME"}, "External": {"EXTERNAL", "NETWORK", "REMOTE", "SHARED"}}


def test_to_u64_is_identity() -> None:
    assert DynamoHasher(block_size=4).to_u64(2**64 - 1) == 2**64 - 1


H4 = DynamoHasher(block_size=4)
BAD = [
    ("block size 0", lambda: DynamoHasher(block_size=0), "block_size must be an integer >= 1, got 0"),
    ("block size missing", lambda: DynamoHasher(), None),
    ("eagle not bool", lambda: DynamoHasher(block_size=4, is_eagle=1), "is_eagle must be a bool, got 1"),
    ("negative token", lambda: H4.local_block_hashes([1, -2, 3, 4]), "token_ids must be >= 0, got -2"),
    ("token beyond u32", lambda: H4.local_block_hashes([2**32, 1, 2, 3]), "token_ids must fit 32 bits"),
    ("extras not RequestExtras", lambda: H4.local_block_hashes([1], "lora"),
     "extras must be a RequestExtras or None, got str"),
    ("mm twice", lambda: H4.local_block_hashes(range(8), RequestExtras(mm_items=(MMItem("a", 0, 1),)),
                                               block_mm_hashes=[[1], None]),
     "either as extras.mm_items or as block_mm_hashes, not both"),
    ("mm too short", lambda: H4.local_block_hashes(range(8), block_mm_hashes=[None]),
     r"one entry per block \(2 hashed blocks, 2 prompt blocks\), got 1"),
    ("mm too long", lambda: H4.local_block_hashes(range(9), block_mm_hashes=[None] * 4),
     r"\(2 hashed blocks, 3 prompt blocks\), got 4"),
    ("mm not a list", lambda: H4.local_block_hashes(range(4), block_mm_hashes=5), "block_mm_hashes must be a list"),
    ("mm entry int", lambda: H4.local_block_hashes(range(4), block_mm_hashes=[7]),
     r"block_mm_hashes\[0\] must be a list of u64 or None, got 7"),
    ("mm hash negative", lambda: H4.local_block_hashes(range(4), block_mm_hashes=[[1, -1]]),
     r"block_mm_hashes\[0\]\[1\] must be an integer in \[0, 2\*\*64\), got -1"),
    ("mm hash string", lambda: H4.local_block_hashes(range(4), block_mm_hashes=[[DIGEST_A]]),
     r"block_mm_hashes\[0\]\[0\] must be an integer"),
    ("sequence of negatives", lambda: H4.sequence_hashes([1, -1]), r"local_hashes\[1\] must be .* got -1"),
    ("to_u64 bytes", lambda: H4.to_u64(b"\x01"), "block_hash must be an integer in"),
    ("lora not str", lambda: salted_seed(lora_name=5), "lora_name must be a str or None, got 5"),
    ("namespace not str", lambda: salted_seed(cache_namespace=b"ns"),
     "cache_namespace must be a str or None, got b'ns'"),
    ("identifier not str", lambda: mm_hash_from_identifier(12), "identifier must be a str, got 12"),
    ("tagged not bool", lambda: mm_hash_from_identifier("x", offset_tagged="yes"), "offset_tagged must be a bool"),
    ("identifier lora not str", lambda: mm_hash_from_identifier("x", lora_name=1),
     "lora_name must be a str or None, got 1"),
    ("unknown medium", lambda: storage_tier_from_medium("gpu"),
     r"medium must be one of \('CPU', 'CPU_PINNED', .*\), got 'gpu'"),
]


@pytest.mark.parametrize(("case", "call", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises(case: str, call, message: str | None) -> None:  # noqa: ANN001
    if message is None:  # a missing keyword-only argument is Python's TypeError
        with pytest.raises(TypeError, match="block_size"):
            call()
        return
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("block_size", [2, 4, 16])
def test_partial_tail_block_gets_no_local_hash_t_d8(block_size: int) -> None:
    """index_blend.md T-D8: k, k + 1 and 2k + 1 tokens give 1, 1 and 2 local hashes (rule D1)."""
    hasher = DynamoHasher(block_size=block_size)
    counts = [len(hasher.local_block_hashes(list(range(1, n + 1)))) for n in (block_size, block_size + 1,
                                                                            2 * block_size + 1)]
    assert counts == [1, 1, 2]
