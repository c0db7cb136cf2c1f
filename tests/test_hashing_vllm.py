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

import cbor2
import numpy as np
import pytest
import xxhash
from hypothesis import assume, given
from hypothesis import strategies as st

import kvlab.hashing
from kvlab.hashing.base import MMItem, RequestExtras, coarse_view
from kvlab.hashing.vllm_extra_keys import mm_keys
from kvlab.hashing.vllm_hash import VllmHasher
from kvlab.hashing.vllm_pickle import FRAME_SIZE_TARGET, pickle_parts

ROOT = Path(__file__).resolve().parents[1]
VECTORS = json.loads((ROOT / "tests" / "vectors" / "vllm_block_hashes.json").read_text())["cases"]
HASH_CASES = [c for c in VECTORS if "block_size" in c["params"]]
COARSE_CASES = [c for c in VECTORS if "group_block_size" in c["params"]]
ALGOS = ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]


def from_json(value: object) -> object:
    """Vector encoding back to Python: lists are tuples, ``{"bytes_hex": h}`` is bytes."""
    if isinstance(value, dict):
        return bytes.fromhex(value["bytes_hex"])
    return tuple(from_json(v) for v in value) if isinstance(value, list) else value


def request_extras(request: dict) -> RequestExtras | None:
    """The vector's request extras (JSON-decoded: every string a separate object, as in vLLM)."""
    fields: dict[str, object] = dict(zip(("lora_name", "lora_path"), request.get("lora", ())))
    fields |= {"cache_salt": request["cache_salt"]} if "cache_salt" in request else {}
    if "mm" in request:
        fields["mm_items"] = tuple(MMItem(*item) for item in request["mm"])
    if "prompt_embeds" in request:
        fields["prompt_embeds"] = {tuple(int(x) for x in rng.split(":")): bytes.fromhex(digest)
                                   for rng, digest in request["prompt_embeds"].items()}
    return RequestExtras(**fields) if fields else None


def vllm_block_hash(algo: str, parent: bytes, tokens: tuple[int, ...], keys: tuple | None) -> bytes:
    """vLLM 0.33's ``hash_block_tokens`` written out with the standard libraries, not kvlab's
    digests (docs/specs/hashing.md §1.2): ``(parent, tokens, keys)`` serialised by pickle
    protocol 5 or canonical CBOR, digested by SHA-256 or XXH3-128."""
    data = cbor2.dumps((parent, tokens, keys), canonical=True) if algo.endswith("_cbor") else \
        pickle.dumps((parent, tokens, keys), protocol=5)
    return hashlib.sha256(data).digest() if algo.startswith("sha256") else xxhash.xxh3_128_digest(data)


def reference_chain(hasher: VllmHasher, tokens: list[int], extras: RequestExtras | None = None) -> list[bytes]:
    """The chain of docs/specs/hashing.md §1.8 by :func:`vllm_block_hash`, from the hasher's root and
    extra keys (both pinned by the golden vectors)."""
    keys = hasher.extra_keys(len(tokens), extras)
    size, h, hashes = hasher.block_size, hasher.none_hash, []
    for i, block_keys in enumerate(keys):
        hashes.append(h := vllm_block_hash(hasher.algo, h, tuple(tokens[i * size:(i + 1) * size]), block_keys))
    return hashes


# --- golden vectors ---------------------------------------------------------------------

@pytest.mark.parametrize("case", HASH_CASES, ids=[f"{c['scheme']}:{c['name']}" for c in HASH_CASES])
def test_vector(case: dict) -> None:
    params, request, expected = case["params"], case["request"], case["expected"]
    hasher = VllmHasher(algo=params["hash_algo"], block_size=params["block_size"], seed=params["PYTHONHASHSEED"])
    tokens, extras = request["token_ids"], request_extras(request)
    assert (hasher.name, hasher.none_hash_seed, hasher.none_hash.hex()) == \
        (case["scheme"], params["none_hash_seed_string"], params["none_hash_hex"])
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


@pytest.mark.parametrize("case", HASH_CASES, ids=[f"{c['scheme']}:{c['name']}" for c in HASH_CASES])
def test_the_reference_recipe_reproduces_the_vectors(case: dict) -> None:
    """The recipe the property tests below hold the hasher to gives vLLM's own hashes, from the
    vector's root, tokens and extra keys alone."""
    params, expected = case["params"], case["expected"]
    size, tokens = params["block_size"], case["request"]["token_ids"]
    h, hashes = bytes.fromhex(params["none_hash_hex"]), []
    for i, keys in enumerate(expected["extra_keys_per_block"]):
        hashes.append(h := vllm_block_hash(params["hash_algo"], h, tuple(tokens[i * size:(i + 1) * size]),
                                           None if keys is None else from_json(keys)))
    assert [h.hex() for h in hashes] == expected["block_hashes_hex"]


def test_every_vector_case_is_run() -> None:
    assert len(HASH_CASES) + len(COARSE_CASES) == len(VECTORS) == 35


@pytest.mark.parametrize(("num_tokens", "hit_tokens"), [(0, 0), (1, 0), (16, 0), (17, 16), (32, 16), (33, 32)])
def test_max_cache_hit_tokens_last_token_rule(num_tokens: int, hit_tokens: int) -> None:
    assert VllmHasher().max_cache_hit_tokens(num_tokens) == hit_tokens


# --- the fast pickle path against pickle itself -------------------------------------------

TOKENS = st.one_of(st.integers(0, 2**32 - 1),
                   st.sampled_from([0, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**39, 2**40, 2**56,
                                    2**63 - 1, 2**63, 2**64 - 1]))


@given(data=st.data(), block_size=st.integers(1, 64), num_blocks=st.integers(1, 4),
       parent_len=st.sampled_from([16, 32]))
def test_fast_pickle_bytes_equal_pickle_dumps(data: st.DataObject, block_size: int, num_blocks: int,
                                              parent_len: int) -> None:
    rows = data.draw(st.lists(st.lists(TOKENS, min_size=block_size, max_size=block_size),
                              min_size=num_blocks, max_size=num_blocks))
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


@given(algo=st.sampled_from(ALGOS), block_size=st.integers(1, 8),
       tokens=st.lists(TOKENS, min_size=9, max_size=60), extras=EXTRAS)
def test_hasher_equals_reference_recipe(algo: str, block_size: int, tokens: list[int],
                                        extras: RequestExtras | None) -> None:
    hasher = VllmHasher(algo=algo, block_size=block_size, seed="0")
    assert hasher.block_hashes(np.array(tokens, dtype=np.uint64), extras) == reference_chain(hasher, tokens, extras)


# --- incremental hashing ------------------------------------------------------------------

INCREMENTAL_CASES = json.loads((Path(__file__).parent / "vectors/vllm_incremental_hashes.json").read_text())["cases"]


@pytest.mark.parametrize("case", INCREMENTAL_CASES, ids=[f"{c['scheme']}:{c['name']}" for c in INCREMENTAL_CASES])
def test_incremental_vector(case: dict) -> None:
    """Item 5: vLLM 0.33's own request_block_hasher, called after every append, returned exactly
    the hashes kvlab's incremental hasher returns (both images kept in a block completed later)."""
    params, request = case["params"], case["request"]
    lora = request["lora"]
    extras = RequestExtras(mm_items=tuple(MMItem(**item) for item in request["mm"]),
                           cache_salt=request["cache_salt"], lora_name=lora and lora["name"],
                           lora_path=lora and lora["path"])
    hasher = VllmHasher(algo=params["hash_algo"], block_size=params["block_size"], seed=params["PYTHONHASHSEED"])
    incremental, start, per_append = hasher.incremental(extras), 0, []
    for step in request["appends"]:
        per_append.append([h.hex() for h in incremental.append(request["token_ids"][start:start + step])])
        start += step
    assert per_append == case["expected"]["new_block_hashes_per_append"]


def test_incremental_vectors_cover_the_two_image_block() -> None:
    assert len(INCREMENTAL_CASES) == 52 and {c["verification"] for c in INCREMENTAL_CASES} == {"upstream_executed"}
    case = next(c for c in INCREMENTAL_CASES if c["name"] == "two_images_block_completed_by_generation")
    hasher = VllmHasher(algo=case["params"]["hash_algo"], block_size=8)
    extras = RequestExtras(mm_items=(MMItem("image-A", 1, 2), MMItem("image-B", 4, 1)))
    assert hasher.extra_keys(8, extras) == [(("mm", "image-A", 1), ("mm", "image-B", 4))]
    assert case["expected"]["new_block_hashes_per_append"] == [[], [], [h.hex() for h in hasher.block_hashes(
        case["request"]["token_ids"], extras)]]


@pytest.mark.parametrize("lead", [0, 8], ids=["first block", "second block"])
def test_incremental_block_with_two_images_equals_at_once(lead: int) -> None:
    """A block of 8 = [t0, A, A, t1, B, t2] + 2 generated tokens; image A at 1-2, B at 4
    (after ``lead`` text tokens): keyed on both images, at once and incrementally, as vLLM 0.33
    (test_incremental_vector)."""
    hasher = VllmHasher(block_size=8)
    extras = RequestExtras(mm_items=(MMItem("image-A", lead + 1, 2), MMItem("image-B", lead + 4, 1)))
    prompt, generated = list(range(100, 100 + lead)) + [11, 900, 900, 12, 901, 13], [14, 15]
    request = hasher.incremental(extras)
    assert len(request.append(prompt)) == lead // 8
    assert request.append(generated[:1]) == [] and len(request.append(generated[1:])) == 1
    assert request.block_hashes == hasher.block_hashes(prompt + generated, extras) and request.num_tokens == lead + 8
    assert hasher.extra_keys(lead + 8, extras)[-1] == (("mm", "image-A", 1), ("mm", "image-B", 4))


@st.composite
def mm_layouts(draw: st.DrawFn) -> tuple[list[int], tuple[MMItem, ...], list[int]]:
    """Random tokens, non-overlapping MM items inside the prompt, chunk cuts."""
    tokens = draw(st.lists(st.integers(0, 200_000), max_size=48))
    items, position = [], 0
    for _ in range(draw(st.integers(0, 5))):
        offset = position + draw(st.integers(0, 6))
        length = draw(st.integers(1, 9))
        items.append(MMItem(draw(st.sampled_from(["img-a", "img-b", "a" * 64])), offset, length))
        position = offset + length
    items = [item for item in items if item.end <= len(tokens)]
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
    appended = [h for start, end in zip([0, *cuts], [*cuts, len(tokens)]) for h in request.append(tokens[start:end])]
    at_once = hasher.block_hashes(tokens, extras)
    assert appended == request.block_hashes == at_once and len(at_once) == len(tokens) // block_size


def test_mm_scan_rule_stops_at_an_item_running_past_the_block() -> None:
    """vLLM's scan (§1.5) passes an item only once a block reaches its end, so an item nested
    in a longer one (which RequestExtras rejects) is never keyed."""
    items, cursor, keys = (MMItem("outer", 0, 10), MMItem("inner", 2, 2)), 0, []
    for start in (0, 4, 8):
        block, cursor = mm_keys(items, start, start + 4, cursor)
        keys.append(block)
    assert keys == [[("mm", "outer", 0)], [("mm", "outer", -4)], [("mm", "outer", -8)]] and cursor == 2


# --- extra keys ---------------------------------------------------------------------------

def test_prompt_embeds_array_is_hashed_by_rows_c_contiguous() -> None:
    embeds = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    hasher = VllmHasher(block_size=4)
    keys = hasher.extra_keys(8, RequestExtras(prompt_embeds=embeds))
    assert keys == [(("prompt_embeds", hashlib.sha256(embeds[:4].tobytes()).digest()),),
                    (("prompt_embeds", hashlib.sha256(embeds[4:].tobytes()).digest()),)]
    assert hasher.extra_keys(8, RequestExtras(prompt_embeds=np.asfortranarray(embeds))) == keys
    as_mapping = {(0, 4): keys[0][0][1], (4, 8): keys[1][0][1]}
    assert hasher.block_hashes(range(8), RequestExtras(prompt_embeds=as_mapping)) == \
        hasher.block_hashes(range(8), RequestExtras(prompt_embeds=embeds))
    assert hasher.event_extra_keys(8, RequestExtras(prompt_embeds=embeds)) == [(keys[0][0][1],), (keys[1][0][1],)]
    half = embeds.astype(np.float16)  # same values, other raw bytes: other keys (vLLM hashes the bytes)
    assert hasher.extra_keys(8, RequestExtras(prompt_embeds=half))[0] == \
        (("prompt_embeds", hashlib.sha256(half[:4].tobytes()).digest()),) != keys[0]


def fresh(text: str) -> str:  # a new str object equal to text (CPython caches "" and 1-char strings)
    return text.encode("utf-8").decode("utf-8")


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("text", ["tenant-x", "lora", "mm", "a"])
def test_keys_depend_on_string_values_not_identity(algo: str, text: str) -> None:
    """Pickle memoises repeated objects: one str object as LoRA name, path, salt and two MM
    ids (``text`` itself; for "lora"/"mm" the very interned tag) hashes like vLLM's
    separately decoded strings (``fresh``), with the tags as shared literals."""
    hasher = VllmHasher(algo=algo, block_size=4, seed="0")
    shared, distinct = (hasher.block_hashes(range(4), RequestExtras(
        lora_name=make(), lora_path=make(), cache_salt=make(), mm_items=(MMItem(make(), 1, 2), MMItem(make(), 3, 1))))
        for make in (lambda: text, lambda: fresh(text)))
    vllm_keys = (("lora", fresh(text), fresh(text)), ("mm", fresh(text), 1), ("mm", fresh(text), 3),
                 ("cache_salt", fresh(text)))
    assert shared == distinct == [vllm_block_hash(algo, hasher.none_hash, (0, 1, 2, 3), vllm_keys)]


@pytest.mark.parametrize("algo", ALGOS)
def test_numpy_int_mm_offsets_hash_like_python_ints(algo: str) -> None:
    hasher = VllmHasher(algo=algo, block_size=4, seed="0")
    as_numpy, as_python = (RequestExtras(mm_items=(MMItem("img", o, n),))
                           for o, n in [(np.int64(5), np.int64(6)), (5, 6)])
    assert hasher.block_keys(range(12), as_numpy).tolist() == hasher.block_keys(range(12), as_python).tolist()
    events = hasher.event_extra_keys(12, as_numpy)
    assert events == hasher.event_extra_keys(12, as_python) == [None, (("img", 1),), (("img", -3),)]
    assert [type(block[0][1]) for block in events[1:]] == [int, int]  # == alone would accept np.int64


def test_lora_and_salt_keys() -> None:
    """A missing LoRA path is hashed as vLLM's default ""; an empty salt is no salt."""
    hasher = VllmHasher(block_size=4)
    assert hasher.block_hashes(range(4), RequestExtras(lora_name="ad")) == \
        [vllm_block_hash("sha256", hasher.none_hash, (0, 1, 2, 3), (("lora", "ad", ""),))]
    assert hasher.extra_keys(8, RequestExtras(cache_salt="")) == [None, None]
    assert hasher.block_hashes(range(8), RequestExtras(cache_salt="")) == hasher.block_hashes(range(8))
    with_identity = RequestExtras(lora_name="ad", lora_path="/p", lora_identity="sha-v1", cache_salt="t")
    lora = (("lora", "ad"), ("lora_identity", "sha-v1"))
    assert hasher.extra_keys(8, with_identity) == [(*lora, ("cache_salt", "t")), lora]
    assert hasher.event_extra_keys(8, with_identity) == [("ad", "t"), ("ad",)]


# --- cases from public bug reports ---------------------------------------------------------

TOKENS_1_8 = list(range(1, 9))


def test_bug_same_adapter_name_different_content_shares_no_block() -> None:
    pairs = ([RequestExtras(lora_name="ad", lora_path="/p", lora_identity=i) for i in ("weights-1", "weights-2")],
             [RequestExtras(lora_name="ad", lora_path=p) for p in ("/a", "/b")])
    for a, b in ([VllmHasher(block_size=4).block_hashes(TOKENS_1_8, extras) for extras in pair] for pair in pairs):
        assert not set(a) & set(b)


def test_bug_adapter_int_ids_and_reload_in_place() -> None:
    """vLLM 0.33 keys on an adapter's name and path, not its per-instance integer id; one reloaded
    in place under the same name and path keeps its stale blocks (#42125) unless lora_identity is set."""
    name_path = {"lora_name": "ad", "lora_path": "/adapters/ad"}
    before, after = (VllmHasher(block_size=4).block_hashes(TOKENS_1_8, RequestExtras(**name_path, lora_identity=v))
                     for v in ("v1", "v2"))
    assert not set(before) & set(after)
    assert VllmHasher(block_size=4).block_hashes(TOKENS_1_8, RequestExtras(**name_path)) == \
        VllmHasher(block_size=4).block_hashes(TOKENS_1_8, RequestExtras(**name_path))


def test_bug_image_digests_sharing_their_last_hex_digits() -> None:
    ids = [hashlib.sha256(b).hexdigest()[:60] + "beef" for b in (b"cat", b"dog")]
    hasher = VllmHasher(block_size=4)
    a, b = (hasher.block_hashes([5, 6, 7, 8] + [9] * 8, RequestExtras(mm_items=(MMItem(i, 4, 8),))) for i in ids)
    assert a[0] == b[0] and a[1] != b[1] and a[2] != b[2]
    assert hasher.event_extra_keys(12, RequestExtras(mm_items=(MMItem(ids[0], 4, 8),)))[1] == ((ids[0], 0),)


def test_bug_linear_token_edit_changes_the_hash() -> None:
    a, b = (VllmHasher(block_size=2).block_hashes(t) for t in ([1, 2, 100, 200], [1, 2, 131, 199]))
    assert a[0] == b[0] and a[1] != b[1]


@given(tokens=st.lists(st.integers(3300, 100_000), min_size=2, max_size=12), data=st.data(),
       block_size=st.integers(1, 4), d=st.integers(1, 50), k=st.integers(1, 64))
def test_no_small_linear_edit_keeps_a_hash(tokens: list[int], data: st.DataObject, block_size: int, d: int,
                                           k: int) -> None:
    i = data.draw(st.integers(0, len(tokens) - 2))
    edited = tokens[:i] + [tokens[i] + d, tokens[i + 1] - d * k] + tokens[i + 2:]
    before, after = (VllmHasher(block_size=block_size).block_hashes(t) for t in (tokens, edited))
    first = i // block_size
    assume(first < len(before))
    assert before[:first] == after[:first] and all(x != y for x, y in zip(before[first:], after[first:]))


CHILD = """
import json, sys
from kvlab.hashing.vllm_hash import VllmHasher
configs = json.loads(sys.argv[1])
print(json.dumps([[h.hex() for h in VllmHasher(algo=a, block_size=4, seed=s).block_hashes(range(1, 11))]
                  for a, s in configs]))
"""


def test_bug_hashes_reproduce_across_processes_and_seeds_separate_them() -> None:
    configs = [("sha256", None), ("sha256_cbor", None)] + [(a, "42") for a in ALGOS] + [("sha256", "43")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "random"}
    child = subprocess.run([sys.executable, "-c", CHILD, json.dumps(configs)], env=env, cwd=ROOT,
                           capture_output=True, text=True, check=True, timeout=300)
    here = [[h.hex() for h in VllmHasher(algo=a, block_size=4, seed=s).block_hashes(range(1, 11))]
            for a, s in configs]
    assert json.loads(child.stdout) == here
    assert len(here[2]) == 2 and here[2][0] != here[-1][0] and here[2][1] != here[-1][1]  # seed "42" vs "43"


# --- seeds and validation -----------------------------------------------------------------

@pytest.mark.parametrize("algo", ["xxhash", "xxhash_cbor"])
def test_rng_or_sha256_without_seed_is_silent(algo: str, recwarn: pytest.WarningsRecorder) -> None:
    one, two, again = (VllmHasher(algo=algo, rng=np.random.default_rng(s)) for s in (1, 2, 1))
    assert VllmHasher(algo="sha256_cbor").none_hash_seed == "vllm-none-hash"  # sha256: fixed seed
    assert not recwarn.list
    tokens = list(range(32))
    assert len(one.none_hash_seed) == 64 and one.none_hash_seed != two.none_hash_seed and len(one.none_hash) == 16
    assert not set(one.block_hashes(tokens)) & set(two.block_hashes(tokens))
    assert one.block_hashes(tokens) == again.block_hashes(tokens)


@pytest.mark.parametrize("make", [lambda: VllmHasher(algo="xxhash"), lambda: kvlab.hashing.vllm("xxhash_cbor"),
                                  lambda: kvlab.hashing.get_hasher("vllm", algo="xxhash")],
                         ids=["class", "factory", "get_hasher"])
def test_xxhash_without_seed_or_rng_warns_at_the_caller(make: object) -> None:
    with pytest.warns(UserWarning, match="never shares cache keys") as record:
        make()
    assert [w.filename for w in record] == [__file__]


@pytest.mark.parametrize(("make", "message"), [
    (lambda: VllmHasher(algo="md5"),
     r"algo must be one of \('sha256', 'sha256_cbor', 'xxhash', 'xxhash_cbor'\), got 'md5'"),
    (lambda: VllmHasher(block_size=0), "block_size must be an integer >= 1, got 0"),
    (lambda: VllmHasher(seed=42), "seed must be a str or None, got 42"),
    (lambda: VllmHasher(rng=42),
     r"rng must be a numpy.random.Generator or None \(numpy.random.default_rng\(seed\)\), got 42"),
    (lambda: VllmHasher(rng=np.random.default_rng(0)), "rng is only used for the xxhash algos with seed=None"),
    (lambda: VllmHasher(algo="xxhash", seed="0", rng=np.random.default_rng(0)), "rng is only used .* seed='0'"),
    (lambda: VllmHasher().block_hashes([1, -2, 3]), "token_ids must be >= 0, got -2"),
    (lambda: VllmHasher().block_hashes([1, 2], extras="salt"), "extras must be a RequestExtras or None, got str"),
    (lambda: VllmHasher().extra_keys(-1), "num_tokens must be an integer >= 0, got -1"),
    (lambda: VllmHasher().max_cache_hit_tokens(2.5), "num_tokens must be an integer >= 0, got 2.5"),
    (lambda: VllmHasher().extra_keys(16, RequestExtras(lora_path="/p")), "need a lora_name"),
    (lambda: RequestExtras(lora_name=""), "lora_name must be a non-empty str or None, got ''"),
    (lambda: VllmHasher().extra_keys(16, RequestExtras(prompt_embeds=np.full((16, 2), None))),
     "prompt_embeds must have a numeric dtype .* got dtype object"),
    (lambda: VllmHasher().extra_keys(16, RequestExtras(prompt_embeds=np.full((16, 2), "x"))), "numeric .* <U1"),
    (lambda: VllmHasher(block_size=4).extra_keys(8, RequestExtras(prompt_embeds={(0, 4): bytes(32)})),
     r"needs a 32-byte sha256 digest for block \(4, 8\), got None"),
    (lambda: VllmHasher().extra_keys(16, RequestExtras(prompt_embeds=np.zeros(16))),
     r"prompt_embeds must be a \(num_tokens, hidden\) array, got shape \(16,\)"),
    (lambda: VllmHasher().to_u64(bytes(16)), "block_hash must be a 32-byte vllm.sha256 digest"),
    (lambda: pickle_parts(np.zeros((2, 3), np.int64), 32), "blocks must be a uint64"),
], ids=["algo", "block_size", "int seed", "rng", "rng with sha256", "rng with seed", "negative token", "extras type",
        "num_tokens", "float num_tokens", "lora path without name", "empty lora name", "embeds object dtype",
        "embeds str dtype", "embeds mapping gap", "embeds 1-D", "to_u64 length", "pickle_parts dtype"])
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
