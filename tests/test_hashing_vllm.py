"""vLLM 0.33 block hashing: golden vectors, the fast pickle path against pickle itself,
incremental hashing, and cases from public bug reports."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import pickletools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from kvlab.hashing.base import MMItem, RequestExtras, coarse_view
from kvlab.hashing.digests import hash_fn
from kvlab.hashing.vllm_hash import VllmHasher
from kvlab.hashing.vllm_pickle import FRAME_SIZE_TARGET, pickle_parts

ROOT = Path(__file__).resolve().parents[1]
VECTORS = json.loads((ROOT / "tests" / "vectors" / "vllm_block_hashes.json").read_text())["cases"]
HASH_CASES = [c for c in VECTORS if "block_size" in c["params"]]
COARSE_CASES = [c for c in VECTORS if "group_block_size" in c["params"]]


def from_json(value: object) -> object:
    """Vector encoding back to Python: lists are tuples, ``{"bytes_hex": h}`` is bytes."""
    if isinstance(value, dict):
        return bytes.fromhex(value["bytes_hex"])
    if isinstance(value, list):
        return tuple(from_json(v) for v in value)
    return value


def request_extras(request: dict) -> RequestExtras | None:
    fields: dict[str, object] = {}
    if "lora" in request:
        fields["lora_name"], fields["lora_path"] = request["lora"]
    if "mm" in request:
        fields["mm_items"] = tuple(MMItem(*item) for item in request["mm"])
    if "cache_salt" in request:
        fields["cache_salt"] = request["cache_salt"]
    if "prompt_embeds" in request:
        fields["prompt_embeds"] = {tuple(int(x) for x in rng.split(":")): bytes.fromhex(digest)
                                   for rng, digest in request["prompt_embeds"].items()}
    return RequestExtras(**fields) if fields else None


def reference_chain(hasher: VllmHasher, tokens: list[int], extras: RequestExtras | None = None) -> list[bytes]:
    """The recipe of docs/specs/hashing.md §1.8, one ``hash_fn`` call per block."""
    size, h, hashes = hasher.block_size, hasher.none_hash, []
    for i, keys in enumerate(hasher.extra_keys(len(tokens), extras)):
        h = hash_fn(hasher.algo)((h, tuple(tokens[i * size:(i + 1) * size]), keys))
        hashes.append(h)
    return hashes


# --- golden vectors ---------------------------------------------------------------------

@pytest.mark.parametrize("case", HASH_CASES, ids=[f"{c['scheme']}:{c['name']}" for c in HASH_CASES])
def test_vector(case: dict) -> None:
    params, request, expected = case["params"], case["request"], case["expected"]
    hasher = VllmHasher(algo=params["hash_algo"], block_size=params["block_size"], seed=params["PYTHONHASHSEED"])
    tokens, extras = request["token_ids"], request_extras(request)
    assert hasher.name == case["scheme"]
    assert hasher.none_hash_seed == params["none_hash_seed_string"]
    assert hasher.none_hash.hex() == params["none_hash_hex"]
    hashes = hasher.block_hashes(tokens, extras)
    assert [h.hex() for h in hashes] == expected["block_hashes_hex"]
    assert [hasher.to_u64(h) for h in hashes] == expected["block_hashes_event_u64"]
    assert hasher.block_keys(tokens, extras).tolist() == expected["block_hashes_event_u64"]
    assert hasher.extra_keys(len(tokens), extras) == [from_json(k) for k in expected["extra_keys_per_block"]]
    events = expected["event_extra_keys"]
    assert hasher.event_extra_keys(len(tokens), extras) == (None if events is None else [from_json(k) for k in events])
    assert hasher.max_cache_hit_tokens(len(tokens)) == expected["max_cache_hit_blocks"] * params["block_size"]
    request_hasher = hasher.incremental(extras)
    for token in tokens:
        request_hasher.append([token])
    assert request_hasher.block_hashes == hashes


@pytest.mark.parametrize("case", COARSE_CASES, ids=[c["name"] for c in COARSE_CASES])
def test_vector_coarse_view(case: dict) -> None:
    params, expected = case["params"], case["expected"]
    hasher = VllmHasher(algo=params["hash_algo"], block_size=params["hash_block_size"], seed=params["PYTHONHASHSEED"])
    fine = hasher.block_hashes(case["request"]["token_ids"])
    assert [h.hex() for h in fine] == expected["fine_block_hashes_hex"]
    scale = params["group_block_size"] // params["hash_block_size"]
    assert [h.hex() for h in coarse_view(fine, scale)] == expected["group_block_hashes_hex"]


def test_every_vector_case_is_run() -> None:
    assert len(HASH_CASES) + len(COARSE_CASES) == len(VECTORS) == 35


@pytest.mark.parametrize(("n_tokens", "hit_tokens"), [(0, 0), (1, 0), (16, 0), (17, 16), (32, 16), (33, 32)])
def test_max_cache_hit_tokens_last_token_rule(n_tokens: int, hit_tokens: int) -> None:
    assert VllmHasher().max_cache_hit_tokens(n_tokens) == hit_tokens


# --- the fast pickle path against pickle itself -------------------------------------------

TOKENS = st.one_of(st.integers(0, 2**32 - 1),
                   st.sampled_from([0, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**39, 2**40, 2**56,
                                    2**63 - 1, 2**63, 2**64 - 1]))


@given(data=st.data(), block_size=st.integers(1, 64), n_blocks=st.integers(1, 4), parent_len=st.sampled_from([16, 32]))
def test_fast_pickle_bytes_equal_pickle_dumps(data: st.DataObject, block_size: int, n_blocks: int,
                                              parent_len: int) -> None:
    rows = data.draw(st.lists(st.lists(TOKENS, min_size=block_size, max_size=block_size),
                              min_size=n_blocks, max_size=n_blocks))
    parent = data.draw(st.binary(min_size=parent_len, max_size=parent_len))
    prefixes, suffixes = pickle_parts(np.array(rows, dtype=np.uint64), parent_len)
    for row, prefix, suffix in zip(rows, prefixes, suffixes):
        assert prefix + parent + suffix == pickle.dumps((parent, tuple(row), None), protocol=5)


def test_fast_pickle_opcodes() -> None:
    prefixes, suffixes = pickle_parts(np.array([[7, 300, 70000, 2**31, 2**64 - 1]], np.uint64), 32)
    ops = [(op.name, arg) for op, arg, _ in pickletools.genops(prefixes[0] + bytes(32) + suffixes[0])]
    assert ops == [("PROTO", 5), ("FRAME", 70), ("SHORT_BINBYTES", bytes(32)), ("MEMOIZE", None), ("MARK", None),
                   ("BININT1", 7), ("BININT2", 300), ("BININT", 70000), ("LONG1", 2**31), ("LONG1", 2**64 - 1),
                   ("TUPLE", None), ("MEMOIZE", None), ("NONE", None), ("TUPLE3", None), ("MEMOIZE", None),
                   ("STOP", None)]


@pytest.mark.parametrize(("block_size", "frames"), [(13098, 1), (13099, 1), (13101, 2)])
def test_pickles_of_64_kib_are_left_to_pickle(block_size: int, frames: int) -> None:
    """With BININT tokens the FRAME is 42 + 5 * B bytes. CPython starts a new frame at the
    first opcode boundary at or past 64 KiB (B = 13101); kvlab builds the bytes itself
    only for pickles below 64 KiB (B <= 13098) and lets pickle write the others."""
    tokens = [70000 + i % 7 for i in range(2 * block_size)]
    payload = pickle.dumps((bytes(32), tuple(tokens[:block_size]), None), protocol=5)
    assert sum(op.name == "FRAME" for op, _, _ in pickletools.genops(payload)) == frames
    assert (pickle_parts(np.array([tokens[:block_size]], np.uint64), 32) is None) == \
        (42 + 5 * block_size >= FRAME_SIZE_TARGET)
    hasher = VllmHasher(block_size=block_size)
    assert hasher.block_hashes(tokens) == reference_chain(hasher, tokens)


EXTRAS = st.one_of(st.none(), st.builds(RequestExtras, cache_salt=st.sampled_from(["", "tenant"])),
                   st.builds(RequestExtras, lora_name=st.just("ad"), lora_path=st.just("/p/ad")),
                   st.builds(RequestExtras, mm_items=st.just((MMItem("img", 3, 6),))))


@given(algo=st.sampled_from(["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]), block_size=st.integers(1, 8),
       tokens=st.lists(TOKENS, max_size=60), extras=EXTRAS)
def test_hasher_equals_reference_recipe(algo: str, block_size: int, tokens: list[int],
                                        extras: RequestExtras | None) -> None:
    hasher = VllmHasher(algo=algo, block_size=block_size, seed="0")
    assert hasher.block_hashes(np.array(tokens, dtype=np.uint64), extras) == reference_chain(hasher, tokens, extras)


# --- incremental hashing ------------------------------------------------------------------

@pytest.mark.parametrize("lead", [0, 8], ids=["first block", "second block"])
def test_incremental_block_with_two_images_equals_at_once(lead: int) -> None:
    """A block of 8 = [t0, A, A, t1, B, t2] + 2 generated tokens; image A at 1-2, B at 4
    (after ``lead`` text tokens). vLLM resumes a later call's MM scan at the last image,
    which would key the second block on B only; kvlab keys both."""
    hasher = VllmHasher(block_size=8)
    extras = RequestExtras(mm_items=(MMItem("image-A", lead + 1, 2), MMItem("image-B", lead + 4, 1)))
    prompt, generated = list(range(100, 100 + lead)) + [11, 900, 900, 12, 901, 13], [14, 15]
    request = hasher.incremental(extras)
    assert len(request.append(prompt)) == lead // 8
    assert request.append(generated[:1]) == []
    completed = request.append(generated[1:])
    assert len(completed) == 1
    assert request.block_hashes == hasher.block_hashes(prompt + generated, extras)
    assert hasher.extra_keys(lead + 8, extras)[-1] == (("mm", "image-A", 1), ("mm", "image-B", 4))
    assert request.num_tokens == lead + 8


@st.composite
def mm_layouts(draw: st.DrawFn) -> tuple[list[int], tuple[MMItem, ...], list[int]]:
    """Random tokens, non-overlapping MM items (possibly past the prompt), chunk cuts."""
    tokens = draw(st.lists(st.integers(0, 200_000), max_size=48))
    items, position = [], 0
    for _ in range(draw(st.integers(0, 5))):
        offset = position + draw(st.integers(0, 6))
        length = draw(st.integers(1, 9))
        items.append(MMItem(draw(st.sampled_from(["img-a", "img-b", "a" * 64])), offset, length))
        position = offset + length
    cuts = sorted(draw(st.lists(st.integers(0, len(tokens)), max_size=6)))
    return tokens, tuple(items), cuts


@given(layout=mm_layouts(), block_size=st.integers(1, 8), algo=st.sampled_from(["sha256", "sha256_cbor"]),
       salt=st.sampled_from([None, "s"]), lora=st.booleans())
def test_incremental_equals_at_once(layout: tuple[list[int], tuple[MMItem, ...], list[int]], block_size: int,
                                    algo: str, salt: str | None, lora: bool) -> None:
    tokens, items, cuts = layout
    extras = RequestExtras(mm_items=items, cache_salt=salt, lora_name="ad" if lora else None)
    hasher = VllmHasher(algo=algo, block_size=block_size)
    request = hasher.incremental(extras)
    appended: list[bytes] = []
    for start, end in zip([0, *cuts], [*cuts, len(tokens)]):
        appended += request.append(tokens[start:end])
    at_once = hasher.block_hashes(tokens, extras)
    assert appended == request.block_hashes == at_once
    assert len(at_once) == len(tokens) // block_size


def test_mm_scan_rule_stops_at_an_item_running_past_the_block() -> None:
    """vLLM's scan (§1.5) moves past an item only once a block reaches its end, so an item
    nested in a longer one is never keyed."""
    extras = RequestExtras(mm_items=(MMItem("outer", 0, 10), MMItem("inner", 2, 2)))
    assert VllmHasher(block_size=4).extra_keys(12, extras) == [
        (("mm", "outer", 0),), (("mm", "outer", -4),), (("mm", "outer", -8),)]


# --- extra keys ---------------------------------------------------------------------------

def test_prompt_embeds_array_is_hashed_by_rows_c_contiguous() -> None:
    embeds = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    hasher = VllmHasher(block_size=4)
    keys = hasher.extra_keys(8, RequestExtras(prompt_embeds=embeds))
    assert keys == [(("prompt_embeds", hashlib.sha256(embeds[:4].tobytes()).digest()),),
                    (("prompt_embeds", hashlib.sha256(embeds[4:].tobytes()).digest()),)]
    fortran = np.asfortranarray(embeds)
    assert hasher.extra_keys(8, RequestExtras(prompt_embeds=fortran)) == keys
    as_mapping = {(0, 4): keys[0][0][1], (4, 8): keys[1][0][1]}
    assert hasher.block_hashes(range(8), RequestExtras(prompt_embeds=as_mapping)) == \
        hasher.block_hashes(range(8), RequestExtras(prompt_embeds=embeds))
    assert hasher.event_extra_keys(8, RequestExtras(prompt_embeds=embeds)) == [(keys[0][0][1],), (keys[1][0][1],)]


def test_lora_keys() -> None:
    hasher = VllmHasher(block_size=4)
    assert hasher.extra_keys(4, RequestExtras(lora_name="ad")) == [(("lora", "ad", ""),)]
    with_identity = RequestExtras(lora_name="ad", lora_path="/p", lora_identity="sha-v1", cache_salt="t")
    lora = (("lora", "ad"), ("lora_identity", "sha-v1"))
    assert hasher.extra_keys(8, with_identity) == [(*lora, ("cache_salt", "t")), lora]
    assert hasher.event_extra_keys(8, with_identity) == [("ad", "t"), ("ad",)]


# --- cases from public bug reports ---------------------------------------------------------

TOKENS_1_8 = list(range(1, 9))


def test_bug_same_adapter_name_different_content_shares_no_block() -> None:
    hasher = VllmHasher(block_size=4)
    by_identity = [hasher.block_hashes(TOKENS_1_8, RequestExtras(lora_name="ad", lora_path="/p", lora_identity=i))
                   for i in ("weights-1", "weights-2")]
    by_path = [hasher.block_hashes(TOKENS_1_8, RequestExtras(lora_name="ad", lora_path=p)) for p in ("/a", "/b")]
    assert not set(by_identity[0]) & set(by_identity[1])
    assert not set(by_path[0]) & set(by_path[1])


def test_bug_same_adapter_under_different_int_ids_shares_all_blocks() -> None:
    """vLLM 0.33 hashes the adapter's name and path, not its integer id (each instance
    numbers adapters in load order), so two instances agree."""
    extras = RequestExtras(lora_name="ad", lora_path="/adapters/ad")
    assert VllmHasher(block_size=4).block_hashes(TOKENS_1_8, extras) == \
        VllmHasher(block_size=4).block_hashes(TOKENS_1_8, extras)


def test_bug_adapter_reloaded_in_place() -> None:
    hasher = VllmHasher(block_size=4)
    name_path = {"lora_name": "ad", "lora_path": "/adapters/ad"}
    before = hasher.block_hashes(TOKENS_1_8, RequestExtras(**name_path, lora_identity="v1"))
    after = hasher.block_hashes(TOKENS_1_8, RequestExtras(**name_path, lora_identity="v2"))
    assert not set(before) & set(after)
    # vLLM 0.33 keys on name and path only: the stale blocks are reused (issue #42125)
    assert hasher.block_hashes(TOKENS_1_8, RequestExtras(**name_path)) == \
        hasher.block_hashes(TOKENS_1_8, RequestExtras(**name_path))


def test_bug_image_digests_sharing_their_last_hex_digits() -> None:
    ids = [hashlib.sha256(b).hexdigest()[:60] + "beef" for b in (b"cat", b"dog")]
    hasher = VllmHasher(block_size=4)
    tokens = [5, 6, 7, 8] + [9] * 8
    a, b = (hasher.block_hashes(tokens, RequestExtras(mm_items=(MMItem(i, 4, 8),))) for i in ids)
    assert a[0] == b[0]
    assert a[1] != b[1] and a[2] != b[2]
    assert hasher.event_extra_keys(12, RequestExtras(mm_items=(MMItem(ids[0], 4, 8),)))[1] == ((ids[0], 0),)


def test_bug_linear_token_edit_changes_the_hash() -> None:
    hasher = VllmHasher(block_size=2)
    a = hasher.block_hashes([1, 2, 100, 200])
    b = hasher.block_hashes([1, 2, 131, 199])
    assert a[0] == b[0] and a[1] != b[1]


@given(tokens=st.lists(st.integers(3300, 100_000), min_size=2, max_size=12), data=st.data(),
       block_size=st.integers(1, 4), d=st.integers(1, 50), k=st.integers(1, 64))
def test_no_small_linear_edit_keeps_a_hash(tokens: list[int], data: st.DataObject, block_size: int, d: int,
                                           k: int) -> None:
    i = data.draw(st.integers(0, len(tokens) - 2))
    edited = list(tokens)
    edited[i] += d
    edited[i + 1] -= d * k
    hasher = VllmHasher(block_size=block_size)
    before, after = hasher.block_hashes(tokens), hasher.block_hashes(edited)
    first = i // block_size
    assume(first < len(before))
    assert before[:first] == after[:first]
    assert all(x != y for x, y in zip(before[first:], after[first:]))


CHILD = """
import json, sys
from kvlab.hashing.vllm_hash import VllmHasher
configs = json.loads(sys.argv[1])
print(json.dumps([[h.hex() for h in VllmHasher(algo=a, block_size=4, seed=s).block_hashes(range(1, 11))]
                  for a, s in configs]))
"""


def test_bug_hashes_reproduce_across_processes() -> None:
    configs = [("sha256", None), ("sha256_cbor", None)] + [(a, "42") for a in ("sha256", "sha256_cbor", "xxhash",
                                                                                "xxhash_cbor")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "random"}
    child = subprocess.run([sys.executable, "-c", CHILD, json.dumps(configs)], env=env, cwd=ROOT,
                           capture_output=True, text=True, check=True, timeout=300)
    here = [[h.hex() for h in VllmHasher(algo=a, block_size=4, seed=s).block_hashes(range(1, 11))]
            for a, s in configs]
    assert json.loads(child.stdout) == here


def test_bug_two_instances_same_seed_same_chain() -> None:
    tokens = list(range(1, 33))
    assert VllmHasher(seed="42").block_hashes(tokens) == VllmHasher(seed="42").block_hashes(tokens)
    a, b = VllmHasher(seed="42").block_hashes(tokens), VllmHasher(seed="43").block_hashes(tokens)
    assert len(a) == 2 and a[0] != b[0] and a[1] != b[1]


# --- seeds and validation -----------------------------------------------------------------

@pytest.mark.parametrize("algo", ["xxhash", "xxhash_cbor"])
def test_xxhash_without_seed_warns_and_draws_from_rng(algo: str) -> None:
    with pytest.warns(UserWarning, match="never share cache keys"):
        one = VllmHasher(algo=algo, rng=np.random.default_rng(1))
    with pytest.warns(UserWarning):
        two = VllmHasher(algo=algo, rng=np.random.default_rng(2))
    with pytest.warns(UserWarning):
        again = VllmHasher(algo=algo, rng=np.random.default_rng(1))
    with pytest.warns(UserWarning):
        VllmHasher(algo=algo)
    tokens = list(range(32))
    assert len(one.none_hash_seed) == 64 and one.none_hash_seed != two.none_hash_seed
    assert not set(one.block_hashes(tokens)) & set(two.block_hashes(tokens))
    assert one.block_hashes(tokens) == again.block_hashes(tokens)
    assert len(one.none_hash) == 16


def test_sha256_without_seed_uses_the_fixed_seed_silently(recwarn: pytest.WarningsRecorder) -> None:
    assert VllmHasher(algo="sha256_cbor").none_hash_seed == "vllm-none-hash"
    assert not recwarn.list


@pytest.mark.parametrize(("make", "message"), [
    (lambda: VllmHasher(algo="md5"), "unknown hash algo 'md5'"),
    (lambda: VllmHasher(block_size=0), "block_size must be an integer >= 1, got 0"),
    (lambda: VllmHasher(seed=42), "seed must be a string .* got 42"),
    (lambda: VllmHasher(rng=42), "rng must be a numpy.random.Generator or None, got int"),
    (lambda: VllmHasher().block_hashes([1, -2, 3]), "token_ids must be >= 0, got -2"),
    (lambda: VllmHasher().block_hashes([1, 2], extras="salt"), "extras must be a RequestExtras or None, got str"),
    (lambda: VllmHasher().extra_keys(-1), "n_tokens must be an integer >= 0, got -1"),
    (lambda: VllmHasher().max_cache_hit_tokens(2.5), "n_tokens must be an integer >= 0, got 2.5"),
    (lambda: VllmHasher().extra_keys(16, RequestExtras(lora_path="/p")), "need a lora_name"),
    (lambda: VllmHasher(block_size=4).extra_keys(8, RequestExtras(prompt_embeds={(0, 4): bytes(32)})),
     r"needs a 32-byte sha256 digest for block \(4, 8\), got None"),
    (lambda: VllmHasher().extra_keys(16, RequestExtras(prompt_embeds=np.zeros(16))),
     r"prompt_embeds must be a \(n_tokens, hidden\) array, got shape \(16,\)"),
    (lambda: VllmHasher().to_u64(bytes(16)), "block_hash must be a 32-byte vllm.sha256 digest"),
    (lambda: pickle_parts(np.zeros((2, 3), np.int64), 32), "blocks must be a uint64"),
], ids=["algo", "block_size", "int seed", "rng", "negative token", "extras type", "n_tokens", "float n_tokens",
        "lora path without name", "embeds mapping gap", "embeds 1-D", "to_u64 length", "pickle_parts dtype"])
def test_bad_input_raises_value_error(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_failed_append_leaves_the_request_unchanged() -> None:
    hasher = VllmHasher(block_size=4)
    request = hasher.incremental(RequestExtras(prompt_embeds={(0, 4): bytes(32)}))
    first = request.append([1, 2, 3, 4])
    with pytest.raises(ValueError, match=r"block \(4, 8\)"):
        request.append([5, 6, 7, 8])
    with pytest.raises(ValueError, match="token_ids must be >= 0"):
        request.append([-1])
    assert request.block_hashes == first and request.num_tokens == 4
