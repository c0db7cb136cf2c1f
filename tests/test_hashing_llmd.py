"""llm-d request keys and engine→request mapping: every golden vector, chaining, salting, bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.hashing.base import MMItem, RequestExtras, block_mm_identifiers
from kvlab.hashing.llmd_hash import (
    EngineKeyMap,
    LlmdHasher,
    engine_hash_to_u64,
    fnv1a_64,
    map_engine_to_request_keys,
)

VECTORS = json.loads((Path(__file__).parent / "vectors" / "llmd_block_keys.json").read_text())["cases"]


def cases(scheme: str) -> list[dict]:
    return [c for c in VECTORS if c["scheme"] == scheme]


KEY_CASES = cases("llmd.fnv64a_cbor")


def items_for(case: dict) -> tuple[MMItem, ...]:
    """The case's MM items; a case given only per block gets one-token items placed in those blocks."""
    if "mm_items" in case:
        return tuple(MMItem(it["hash"], it["offset"], it["length"]) for it in case["mm_items"])
    block_size = case["params"]["block_size"]
    return tuple(MMItem(identifier, offset=i * block_size + j, length=1)
                 for i, ids in enumerate(case["block_mm_hashes"] or []) for j, identifier in enumerate(ids or []))


def hasher_for(case: dict) -> LlmdHasher:
    p = case["params"]
    return LlmdHasher(block_size=p["block_size"], hash_seed=p["hash_seed"], model_name=p["model_name"])


def test_vector_file_has_all_cases() -> None:
    assert len(VECTORS) == 11 and len(KEY_CASES) == 9


@pytest.mark.parametrize("case", KEY_CASES, ids=[c["name"] for c in KEY_CASES])
def test_request_key_vectors(case: dict) -> None:
    extras = RequestExtras(mm_items=items_for(case))
    keys = hasher_for(case).block_hashes(case["token_ids"], extras, parent_key=case["params"].get("parent_key_u64", 0))
    assert keys == case["expected"]["block_keys_u64"]
    assert [f"{k:016x}" for k in keys] == case["expected"]["block_keys_hex"]


@pytest.mark.parametrize("case", [c for c in KEY_CASES if "init_hash_u64" in c["params"]],
                         ids=[c["name"] for c in KEY_CASES if "init_hash_u64" in c["params"]])
def test_vector_init_hash_is_the_model_root(case: dict) -> None:
    # The vectors' "init_hash_u64" is llm-d's root H(FNV(seed), nil, model), not FNV(seed) alone.
    hasher = hasher_for(case)
    assert hasher.root_key() == case["params"]["init_hash_u64"]
    assert hasher.init_hash == fnv1a_64(case["params"]["hash_seed"].encode())


@pytest.mark.parametrize("case", [c for c in KEY_CASES if c.get("block_mm_hashes")],
                         ids=[c["name"] for c in KEY_CASES if c.get("block_mm_hashes")])
def test_block_mm_identifiers_match_vectors(case: dict) -> None:
    block_size = case["params"]["block_size"]
    num_blocks = len(case["token_ids"]) // block_size
    expected = [tuple(ids or ()) for ids in case["block_mm_hashes"]][:num_blocks]
    assert block_mm_identifiers(items_for(case), num_blocks, block_size) == expected


def test_engine_hash_to_u64_vector() -> None:
    (case,) = cases("llmd.engine_hash_to_u64")
    inputs = [bytes.fromhex(x["bytes_hex"]) if isinstance(x, dict) else x for x in case["inputs"]]
    assert [engine_hash_to_u64(x) for x in inputs] == case["expected"]["u64"]


@pytest.mark.parametrize("label", list(cases("llmd.engine_to_request_mapping")[0]["expected"]))
def test_engine_to_request_mapping_vector(label: str) -> None:
    (case,) = cases("llmd.engine_to_request_mapping")
    engine_bs, request_bs = map(int, re.search(r"engine bs(\d+), request bs(\d+)", label).groups())
    num_tokens = case["params"]["tokens"]
    engine_keys = [1000 + i for i in range(num_tokens // engine_bs)]
    request_keys = list(range(num_tokens // request_bs))  # request key == its index
    mapped = map_engine_to_request_keys(engine_keys, request_keys)
    assert {str(i): keys for i, keys in enumerate(mapped)} == case["expected"][label]


def test_fnv1a_64_reference_values() -> None:
    # Published FNV-1a 64 test vectors (Noll's fnv test suite).
    assert fnv1a_64(b"") == 0xCBF29CE484222325
    assert fnv1a_64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a_64(b"foobar") == 0x85944171F73967E8


def test_root_is_hash_of_init_none_and_model() -> None:
    hasher = LlmdHasher(model_name="m")
    assert hasher.init_hash == 0xCBF29CE484222325  # FNV of the empty seed
    assert hasher.root_key() == 11374735546233341228
    assert hasher.root_key("") == 155877178866718358


TOKENS = list(range(100, 164))  # 4 blocks of 16


def test_two_model_names_share_no_key() -> None:
    a = LlmdHasher(model_name="meta-llama/Llama-3.1-8B").block_hashes(TOKENS)
    b = LlmdHasher(model_name="Qwen/Qwen3-8B").block_hashes(TOKENS)
    assert len(a) == len(b) == 4 and not set(a) & set(b)


def test_a_seeded_hasher_gives_the_vector_keys_in_every_instance_and_form() -> None:
    """Keys depend on the seed, model and tokens only: each new instance (after another seed and
    model were hashed) gives the golden keys, as ints and as the u64 array."""
    case = next(c for c in KEY_CASES if c["name"] == "two_blocks_plus_partial_seeded")
    want = case["expected"]["block_keys_u64"]
    assert case["params"]["hash_seed"] == "test-seed" and len(want) == 2
    for _ in range(2):
        LlmdHasher(block_size=16, hash_seed="other", model_name="m").block_hashes(case["token_ids"])
        hasher = hasher_for(case)
        assert hasher.block_hashes(case["token_ids"]) == want
        assert hasher.block_keys(case["token_ids"]).tolist() == want


def test_seed_changes_every_key() -> None:
    a = LlmdHasher(hash_seed="1").block_hashes(TOKENS)
    b = LlmdHasher(hash_seed="2").block_hashes(TOKENS)
    assert not set(a) & set(b)


def test_lora_name_replaces_model_name_in_root() -> None:
    base = LlmdHasher(model_name="base-model")
    with_lora = base.block_hashes(TOKENS, RequestExtras(lora_name="adapter"))
    assert with_lora == LlmdHasher(model_name="adapter").block_hashes(TOKENS)
    assert not set(with_lora) & set(base.block_hashes(TOKENS))


def test_parent_key_continues_the_chain() -> None:
    hasher = LlmdHasher(block_size=4, model_name="m")
    keys = hasher.block_hashes(list(range(12)))
    assert hasher.block_hashes(list(range(4, 12)), parent_key=keys[0]) == keys[1:]


def test_fields_llmd_ignores_do_not_change_keys() -> None:
    hasher = LlmdHasher(block_size=4)
    lora = RequestExtras(lora_name="a")
    extras = RequestExtras(cache_salt="tenant", lora_name="a", lora_path="/p", lora_identity="d")
    assert hasher.block_hashes(list(range(8)), extras) == hasher.block_hashes(list(range(8)), lora)


DIGEST_A = "f9a38a66df90291515d7ea4de3175b262c1da7668ad1cc32e3dbb98be86388ac"
DIGEST_B = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789ab88ac"  # same last 4 hex digits


def test_images_sharing_last_hex_digits_give_different_keys() -> None:
    hasher = LlmdHasher(block_size=4, model_name="m")
    keys = [hasher.block_hashes(list(range(12)), RequestExtras(mm_items=(MMItem(digest, 4, 4),)))
            for digest in (DIGEST_A, DIGEST_B)]
    assert keys[0][0] == keys[1][0]  # the text block before the image is shared
    assert keys[0][1] != keys[1][1] and keys[0][2] != keys[1][2]


def test_mm_item_order_within_block_is_by_offset() -> None:
    hasher = LlmdHasher(block_size=4, model_name="m")
    items = (MMItem("h2", 2, 2), MMItem("h1", 0, 2))
    assert hasher.block_hashes(list(range(8)), RequestExtras(mm_items=items)) == [
        16747296487193877248, 18272242868188866628]  # vector mm_two_items_one_block


def test_block_mm_identifiers_partial_tail_and_spanning() -> None:
    items = [MMItem("x", 3, 6), MMItem("y", 9, 10)]
    assert block_mm_identifiers(items, 3, 4) == [("x",), ("x",), ("x", "y")]
    assert block_mm_identifiers(items, 0, 4) == []


@given(tokens=st.lists(st.integers(0, 2**32 - 1), min_size=4, max_size=40),
       position=st.integers(0, 39), new_token=st.integers(0, 2**32 - 1))
def test_keys_are_chained(tokens: list[int], position: int, new_token: int) -> None:
    hasher = LlmdHasher(block_size=4, model_name="m")
    position %= len(tokens)
    changed = list(tokens)
    changed[position] = new_token
    before, after = hasher.block_hashes(tokens), hasher.block_hashes(changed)
    block = position // 4
    assert len(before) == len(after) == len(tokens) // 4
    if new_token == tokens[position] or block >= len(before):
        assert before == after
    else:
        assert before[:block] == after[:block]
        assert all(x != y for x, y in zip(before[block:], after[block:]))


def test_partial_tail_dropped_and_counts() -> None:
    hasher = LlmdHasher(block_size=16)
    assert len(hasher.block_hashes(range(47))) == hasher.num_hashed_blocks(47) == 2
    assert hasher.block_hashes([]) == []


def test_to_u64_is_identity() -> None:
    assert LlmdHasher().to_u64(2**64 - 1) == 2**64 - 1


def test_one_to_many_mapping_and_get_request_key_is_last_of_group() -> None:
    keys = EngineKeyMap()
    keys.add([70, 71], [10, 11, 12, 13])
    assert [keys.get_request_key(e) for e in (70, 71, 72)] == [11, 13, None]
    keys.add([50, 51, 52, 53], [20, 21])
    assert [keys.get_request_key(e) for e in (50, 51, 52, 53)] == [20, 20, 21, 21]
    assert len(keys) == 6


def test_engine_key_map_readd_replaces_and_remove() -> None:
    keys = EngineKeyMap()
    keys.add([1, 2], [10, 20])
    keys.add([2], [99])
    assert keys.get_request_key(2) == 99 and keys.get_request_key(1) == 10
    assert keys.remove(2) is True and keys.remove(2) is False
    assert keys.get_request_key(2) is None and len(keys) == 1


def test_engine_key_map_bad_add_records_nothing() -> None:
    keys = EngineKeyMap()
    with pytest.raises(ValueError, match="3 engine keys and 2 request keys are not an integral ratio"):
        keys.add([1, 2, 3], [10, 20])
    assert len(keys) == 0


def test_mapping_of_empty_lists() -> None:
    assert map_engine_to_request_keys([], []) == []


BAD = [
    ("block size 0", lambda: LlmdHasher(block_size=0), "block_size must be an integer >= 1, got 0"),
    ("block size float", lambda: LlmdHasher(block_size=4.0), "block_size must be an integer >= 1, got 4.0"),
    ("seed not str", lambda: LlmdHasher(hash_seed=42), "hash_seed must be a str, got 42"),
    ("model not str", lambda: LlmdHasher(model_name=None), "model_name must be a str, got None"),
    ("root model not str", lambda: LlmdHasher().root_key(3), "model_name must be a str, got 3"),
    ("negative token", lambda: LlmdHasher().block_hashes([1, -2]), "token_ids must be >= 0, got -2"),
    ("token beyond u32", lambda: LlmdHasher().block_hashes([2**32]), "token_ids must fit 32 bits"),
    ("2-d tokens", lambda: LlmdHasher().block_hashes([[1, 2]]), "token_ids must be one-dimensional"),
    ("float tokens", lambda: LlmdHasher().block_hashes([1.5]),
     r"token_ids\[0\] must be an integer in \[0, 2\*\*64\), got 1.5"),
    ("negative parent", lambda: LlmdHasher().block_hashes([1], parent_key=-1),
     r"parent_key must be an integer in \[0, 2\*\*64\), got -1"),
    ("parent beyond u64", lambda: LlmdHasher().block_hashes([1], parent_key=2**64), "parent_key must be"),
    ("bool parent", lambda: LlmdHasher().block_hashes([1], parent_key=True), "parent_key must be .* got True"),
    ("extras not RequestExtras", lambda: LlmdHasher().block_hashes([1], {"lora_name": "x"}),
     "extras must be a RequestExtras or None, got dict"),
    ("to_u64 negative", lambda: LlmdHasher().to_u64(-5), "block_hash must be an integer in"),
    ("ratio 3:2", lambda: map_engine_to_request_keys([1, 2, 3], [4, 5]),
     "3 engine keys and 2 request keys are not an integral ratio"),
    ("no request keys", lambda: map_engine_to_request_keys([1], []),
     "1 engine keys and 0 request keys are not an integral ratio"),
    ("bad engine key", lambda: map_engine_to_request_keys([1, b"x"], [4, 5]), r"engine_keys\[1\] must be"),
    ("bad request key", lambda: map_engine_to_request_keys([1], [-4]), r"request_keys\[0\] must be .* got -4"),
    ("bad lookup key", lambda: EngineKeyMap().get_request_key("7"), "engine_key must be .* got '7'"),
    ("bad remove key", lambda: EngineKeyMap().remove(-1), "engine_key must be .* got -1"),
    ("num_blocks negative", lambda: block_mm_identifiers([], -1, 4), "num_blocks must be an integer >= 0, got -1"),
    ("item not MMItem", lambda: block_mm_identifiers([("a", 0, 1)], 1, 4), "mm_items must be MMItem values"),
]


@pytest.mark.parametrize(("case", "call", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises_value_error(case: str, call, message: str) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match=message):
        call()
