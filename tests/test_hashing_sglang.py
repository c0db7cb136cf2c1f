"""SGLang 0.5.23 page hashes: every golden vector (storage and event chains, seeds, int64
event ids, dynamo-format namespacing), SGLang's pinned namespaced values, chaining
properties, event formats, and bad input."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.hashing import MMItem, RequestExtras
from kvlab.hashing.sglang_hash import (
    SGLangHasher,
    event_chain_seed,
    hash_str_to_int64,
    kv_event_namespace_seed,
    namespaced_block_hash,
    sha256_page_chain,
    storage_namespace_seed,
)

CASES = json.loads((Path(__file__).resolve().parents[1] / "tests/vectors/sglang_page_hashes.json")
                   .read_text())["cases"]
PLAIN_FIELDS = {"page_hashes_hex", "event_block_hashes_i64", "event_parent_of_first"}
NAMESPACED_FIELDS = {"storage_seed_hex", "storage_page_hashes_hex", "event_chain_seed_hex", "event_page_hashes_hex",
                     "dynamo_format_namespace_seed_hex", "dynamo_format_event_block_hashes_i64"}


def case_extras(case: dict) -> RequestExtras:
    params = case["params"]
    assert set(params) == {"page_size", "extra_key", "cache_salt"}, params
    return RequestExtras(lora_name=params["extra_key"], cache_salt=params["cache_salt"])


@pytest.mark.parametrize("case", [pytest.param(c, id=f"{c['scheme']}::{c['name']}") for c in CASES])
def test_golden_vector(case: dict) -> None:
    tokens, expected, extras = case["token_ids"], case["expected"], case_extras(case)
    default = SGLangHasher(page_size=case["params"]["page_size"])
    dynamo = SGLangHasher(page_size=case["params"]["page_size"], event_format="dynamo")
    if case["scheme"] == "sglang.page_sha256":
        assert set(expected) == PLAIN_FIELDS
        assert default.block_hashes(tokens, extras) == expected["page_hashes_hex"]
        assert default.page_hashes_hex(tokens) == expected["page_hashes_hex"]
        for hasher in (default, dynamo):
            assert hasher.event_block_hashes(tokens, extras) == expected["event_block_hashes_i64"]
            assert hasher.event_parent_block_hash(extras) == expected["event_parent_of_first"]
        assert default.block_keys(tokens).tolist() == [v % 2**64 for v in expected["event_block_hashes_i64"]]
        return
    assert case["scheme"] == "sglang.page_sha256.namespaced" and set(expected) == NAMESPACED_FIELDS
    params = case["params"]
    assert storage_namespace_seed(params["extra_key"], params["cache_salt"]) == expected["storage_seed_hex"]
    assert default.page_hashes_hex(tokens, extras) == expected["storage_page_hashes_hex"]
    assert default.block_hashes(tokens, extras) == expected["storage_page_hashes_hex"]
    assert event_chain_seed(params["cache_salt"]) == expected["event_chain_seed_hex"]
    assert default.event_page_hashes_hex(tokens, extras) == expected["event_page_hashes_hex"]
    seed = kv_event_namespace_seed(params["extra_key"], params["cache_salt"])
    assert seed.hex() == expected["dynamo_format_namespace_seed_hex"]
    assert dynamo.event_namespace_seed(extras) == seed
    assert dynamo.event_block_hashes(tokens, extras) == expected["dynamo_format_event_block_hashes_i64"]
    assert dynamo.event_parent_block_hash(extras) is None


def test_vector_file_has_all_cases() -> None:
    assert len(CASES) == 10


def test_sglang_pinned_namespaced_values() -> None:
    """SGLang's own test (TestNamespacedBlockHash.test_values_are_pinned), shared with its Rust copy."""
    seed = kv_event_namespace_seed(extra_key="lora-a", cache_salt=None)
    assert namespaced_block_hash(123, seed) == 9220659119954863560
    assert namespaced_block_hash(-5, seed) == -1810974732006142875


def test_partial_last_page_gets_a_hash() -> None:
    hasher = SGLangHasher(page_size=4)
    assert hasher.hashes_partial_tail and hasher.name == "sglang"
    hashes = hasher.block_hashes(list(range(1, 11)))
    assert len(hashes) == 3 == hasher.num_hashed_blocks(10)
    assert hashes[2] == hashlib.sha256(bytes.fromhex(hashes[1]) + b"\x09\0\0\0\x0a\0\0\0").hexdigest()
    assert hasher.block_hashes(list(range(1, 12)))[:2] == hashes[:2]
    assert hasher.block_hashes(list(range(1, 12)))[2] != hashes[2]


def test_wide_token_rule_boundary() -> None:
    """Only a token above 2**32 - 1 switches the page to ``0xff ‖ u64 LE``."""
    top = 2**32 - 1
    assert sha256_page_chain([top], 1) == [hashlib.sha256(top.to_bytes(4, "little")).hexdigest()]
    assert sha256_page_chain([2**32], 1) == [hashlib.sha256(b"\xff" + (2**32).to_bytes(8, "little")).hexdigest()]
    assert sha256_page_chain(np.array([2**64 - 1], dtype=np.uint64), 1) == [
        hashlib.sha256(b"\xff" + b"\xff" * 8).hexdigest()]


tokens_st = st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=40)


@given(tokens_st, st.integers(1, 6), st.data(), st.sampled_from([None, "lora-a"]), st.sampled_from([None, "t"]))
def test_change_in_page_j_changes_pages_from_j_on(tokens: list[int], page_size: int, data: st.DataObject,
                                                  lora: str | None, salt: str | None) -> None:
    hasher = SGLangHasher(page_size=page_size, event_format="dynamo")
    extras = RequestExtras(lora_name=lora, cache_salt=salt)
    pos = data.draw(st.integers(0, len(tokens) - 1))
    changed = [*tokens[:pos], tokens[pos] ^ 1, *tokens[pos + 1:]]
    j = pos // page_size
    for fn in (hasher.page_hashes_hex, hasher.event_page_hashes_hex, hasher.event_block_hashes):
        before, after = fn(tokens, extras), fn(changed, extras)
        assert fn(list(tokens), extras) == before                 # equal prompts, equal hashes
        assert before[:j] == after[:j]
        assert all(x != y for x, y in zip(before[j:], after[j:], strict=True))


@given(tokens_st, tokens_st, st.integers(1, 4))
def test_prior_continues_a_chain_across_radix_nodes(head: list[int], tail: list[int], page_size: int) -> None:
    head = head * page_size  # a whole number of pages: a radix node boundary
    hasher = SGLangHasher(page_size=page_size)
    first = hasher.page_hashes_hex(head)
    assert hasher.page_hashes_hex(head + tail) == first + hasher.page_hashes_hex(tail, prior=first[-1])
    assert hasher.event_parent_block_hash(prior=first[-1]) == hash_str_to_int64(first[-1])


def test_namespaces_separate_storage_keys() -> None:
    hasher, tokens = SGLangHasher(page_size=4), list(range(8))
    keys = {tuple(hasher.block_hashes(tokens, RequestExtras(lora_name=lora, cache_salt=salt)))
            for lora in (None, "a", "b") for salt in (None, "s", "t")}
    assert len(keys) == 9
    assert hasher.block_hashes(tokens, RequestExtras(cache_salt="")) == hasher.block_hashes(tokens)  # "" = no salt


def test_event_formats() -> None:
    tokens, default, dynamo = list(range(8)), SGLangHasher(page_size=4), SGLangHasher(page_size=4,
                                                                                     event_format="dynamo")
    plain = default.event_block_hashes(tokens)
    lora, salt = RequestExtras(lora_name="lora-a"), RequestExtras(cache_salt="tenant")
    # extra_key is not mixed into the event chain ...
    assert default.event_page_hashes_hex(tokens, lora) == default.page_hashes_hex(tokens)
    # ... the default format namespaces it when it names a LoRA (seed of extra_key alone) ...
    seed = kv_event_namespace_seed("lora-a", None)
    assert default.event_namespace_seed(lora) == seed == dynamo.event_namespace_seed(lora)
    assert default.event_block_hashes(tokens, lora) == [namespaced_block_hash(h, seed) for h in plain]
    # ... and leaves a salt-only request on its salted chain, un-namespaced.
    assert default.event_namespace_seed(salt) is None
    assert default.event_block_hashes(tokens, salt) == [
        hash_str_to_int64(h) for h in default.event_page_hashes_hex(tokens, salt)]
    assert dynamo.event_block_hashes(tokens, salt) != default.event_block_hashes(tokens, salt)
    assert dynamo.event_block_hashes(tokens) == plain and dynamo.event_namespace_seed() is None


def test_to_u64_and_int64_forms() -> None:
    hasher = SGLangHasher(page_size=4)
    assert hash_str_to_int64("ff" * 32) == -1 and hasher.to_u64("ff" * 32) == 2**64 - 1
    assert hash_str_to_int64("7f" + "ff" * 31) == 2**63 - 1 and hash_str_to_int64("80" + "00" * 31) == -(2**63)
    assert hasher.to_u64("00" * 7 + "05" + "ab" * 24) == 5


def test_lora_path_and_identity_do_not_enter_keys() -> None:
    hasher, tokens = SGLangHasher(page_size=2), [5, 6, 7]
    lora = RequestExtras(lora_name="a")
    assert hasher.block_hashes(tokens, RequestExtras(lora_name="a", lora_path="/x", lora_identity="d")) == \
        hasher.block_hashes(tokens, lora)


BAD_CALLS = [
    (lambda: SGLangHasher(page_size=0), "page_size must be an integer >= 1, got 0"),
    (lambda: SGLangHasher(page_size=4, event_format="vllm"),
     "event_format must be one of ('default', 'dynamo'), got 'vllm'"),
    (lambda: SGLangHasher(page_size=4).page_hashes_hex([1], prior="abc"),
     "prior must be a 64-character hex SHA-256 digest, got 'abc'"),
    (lambda: sha256_page_chain([1], 1, prior="zz" * 32), "prior must be a 64-character hex SHA-256 digest"),
    (lambda: SGLangHasher(page_size=4).block_hashes([1, -2]), "token_ids must be >= 0, got -2"),
    (lambda: SGLangHasher(page_size=4).block_hashes([1], RequestExtras(mm_items=(MMItem("i", 0, 1),))),
     "SGLang keys carry multimodal identity in the token ids"),
    (lambda: SGLangHasher(page_size=4).event_block_hashes([1], "salt"),
     "extras must be a RequestExtras or None, got str"),
    (lambda: SGLangHasher(page_size=4).to_u64(b"\x00" * 32), "hash_hex must be a 64-character hex SHA-256 digest"),
    (lambda: storage_namespace_seed(3, None), "extra_key must be a str or None, got 3"),
    (lambda: kv_event_namespace_seed(None, b"s"), "cache_salt must be a str or None, got b's'"),
    (lambda: event_chain_seed(1), "cache_salt must be a str or None, got 1"),
    (lambda: namespaced_block_hash(2**63, bytes(32)),
     "block_hash must be an integer in [-2**63, 2**63), got 9223372036854775808"),
    (lambda: namespaced_block_hash(1, bytes(31)), "namespace_seed must be 32 bytes"),
]


@pytest.mark.parametrize(("call", "message"), BAD_CALLS, ids=[m for _, m in BAD_CALLS])
def test_bad_input_raises(call: object, message: str) -> None:
    with pytest.raises(ValueError) as info:
        call()
    assert message in str(info.value)
