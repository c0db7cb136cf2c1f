"""LMCache 0.5.6 chunk hashes: every upstream-executed vector (each setup: vLLM importable or not,
PYTHONHASHSEED, multimodal placeholders, a prefix cutting an item), the multimodal placeholder fix
vs the 16-bit legacy collision, equality with vLLM (mp sha256_cbor) and disjointness from it
(chunked_token_db), chaining, independence from this process's hash seed, and bad input."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import cbor2
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.hashing import MMItem, RequestExtras
from kvlab.hashing.cpython_hash import python_hash
from kvlab.hashing.digests import DEFAULT_NONE_HASH_SEED, none_hash
from kvlab.hashing.lmcache_hash import MP_BLAKE3_NONE_HASH, LMCacheHasher, normalize_hash_to_int
from kvlab.hashing.lmcache_mm import apply_mm_placeholders, hex_hash_to_int16, mm_placeholder_values

ROOT = Path(__file__).resolve().parents[1]
VECTORS = json.loads((ROOT / "tests/vectors/lmcache_chunk_hashes.json").read_text())
CASES = [c for c in VECTORS["cases"] if c["scheme"] != "lmcache.mm_hash_to_token_values"]
VALUE_CASES = [c for c in VECTORS["cases"] if c["scheme"] == "lmcache.mm_hash_to_token_values"]
U64 = 2**64 - 1


def hasher_for(case: dict) -> LMCacheHasher:
    """The hasher a vector case describes; an unknown parameter fails the test."""
    params = dict(case["params"])
    common = {"chunk_size": params.pop("chunk_size"), "vllm_importable": params.pop("vllm_importable"),
              "none_hash_seed": params.pop("PYTHONHASHSEED"), "python_none_hash": params.pop("python_none_hash", None)}
    if case["scheme"].startswith("lmcache.mp_token_hasher."):
        assert set(params) == {"hash_algorithm"}, params
        return LMCacheHasher(mode="mp_token_hasher", algo=params["hash_algorithm"], **common)
    assert set(params) == {"pre_caching_hash_algorithm", "save_unfull_chunk"}, params
    return LMCacheHasher(mode="chunked_token_db", algo=params["pre_caching_hash_algorithm"],
                         save_unfull_chunk=params["save_unfull_chunk"], **common)


def case_extras(case: dict) -> RequestExtras:
    return RequestExtras(mm_items=tuple(MMItem(**item) for item in case.get("mm_items", [])))


@pytest.mark.parametrize("case", CASES, ids=[f"{c['scheme']}::{c['name']}::{c['params']['PYTHONHASHSEED']}"
                                             for c in CASES])
def test_golden_vector(case: dict) -> None:
    hasher = hasher_for(case)
    assert hasher.name == case["scheme"]
    hashes = hasher.block_hashes(case["token_ids"], case_extras(case))
    expected = case["expected"]
    if hasher.mode == "mp_token_hasher":
        assert [h.hex() for h in hashes] == expected["chunk_hashes_hex"]
        want_keys = [int(h[-16:], 16) for h in expected["chunk_hashes_hex"]]
    else:
        assert hashes == expected["chunk_hashes_int"]
        want_keys = [v & U64 for v in expected["chunk_hashes_int"]]
    assert hasher.block_keys(case["token_ids"], case_extras(case)).tolist() == want_keys
    if "mm_items" not in case:
        assert hasher.num_hashed_blocks(len(case["token_ids"])) == len(hashes)


@pytest.mark.parametrize("case", [c for c in CASES if "mm_items" in c], ids=lambda c: f"{c['scheme']}::{c['name']}")
def test_golden_placeholder_tokens(case: dict) -> None:
    """Item 1: the tokens LMCache's apply_mm_hashes_to_token_ids leaves, item 2: cut at the prefix's end."""
    out = apply_mm_placeholders(case["token_ids"], case_extras(case).mm_items)
    assert out.tolist() == case["expected"]["tokens_after_placeholders"]


@pytest.mark.parametrize("case", VALUE_CASES, ids=[c["name"] for c in VALUE_CASES])
def test_golden_placeholder_values(case: dict) -> None:
    """LMCache 0.5.6 mm_hash_to_token_values: sha256 of the identifier first, then counter blocks."""
    assert mm_placeholder_values(case["identifier"], case["length"]) == case["expected"]["values"]


def test_vector_file_covers_every_setup() -> None:
    assert len(CASES) == 81 and len(VALUE_CASES) == 5
    assert {c["verification"] for c in VECTORS["cases"]} == {"upstream_executed"}
    setups = {(c["scheme"], c["params"]["vllm_importable"], c["params"]["PYTHONHASHSEED"]) for c in CASES}
    assert {("lmcache.chunked_token_db.builtin", True, "0"), ("lmcache.chunked_token_db.builtin", True, "42"),
            ("lmcache.chunked_token_db.builtin.no_vllm", False, None),
            ("lmcache.chunked_token_db.sha256_cbor.no_vllm", False, None),
            ("lmcache.chunked_token_db.xxhash.no_vllm", False, None),
            ("lmcache.mp_token_hasher.builtin", True, "0"),
            ("lmcache.mp_token_hasher.sha256_cbor.no_vllm", False, None),
            ("lmcache.mp_token_hasher.builtin.no_vllm", False, None), ("lmcache.mp_token_hasher.blake3", False, None),
            ("lmcache.chunked_token_db.sha256_cbor", True, None), ("lmcache.mp_token_hasher.sha256_cbor", True, None),
            } <= setups
    names = {c["name"] for c in CASES if "mm_items" in c}
    assert names == {"mm_one_image", "mm_two_images_request_scoped_ids", "mm_prefix_cuts_an_item"}


def test_roots() -> None:
    assert LMCacheHasher().none_hash == 0x9BD96A485AD84EFD  # first 8 bytes of vLLM's sha256_cbor NONE_HASH
    assert LMCacheHasher(algo="sha256").none_hash == 0x066B1E8987E02713
    assert LMCacheHasher(vllm_importable=False).none_hash == 0
    assert MP_BLAKE3_NONE_HASH.hex() == "7e3eff9ef7613a50340eb12677ee03b83ac759fcba9bb32705f07248d56d473b"
    assert LMCacheHasher(mode="mp_token_hasher", algo="sha256_cbor").none_hash == none_hash("sha256_cbor",
                                                                                           DEFAULT_NONE_HASH_SEED)


def test_defaults_and_names() -> None:
    lm = LMCacheHasher()
    assert (lm.block_size, lm.name, lm.hashes_partial_tail, lm.mm_placeholder) == \
        (256, "lmcache.chunked_token_db.sha256_cbor", False, "per_position")
    mp = LMCacheHasher(mode="mp_token_hasher", save_unfull_chunk=False)
    assert (mp.name, mp.hashes_partial_tail) == ("lmcache.mp_token_hasher.blake3", False)
    assert LMCacheHasher(chunk_size=4, algo="xxhash", none_hash_seed="0").name == "lmcache.chunked_token_db.xxhash"


def test_explicit_default_seed_equals_unset_and_other_seed_differs() -> None:
    tokens = list(range(8))
    unset = LMCacheHasher(chunk_size=4).block_hashes(tokens)
    assert LMCacheHasher(chunk_size=4, none_hash_seed=DEFAULT_NONE_HASH_SEED).block_hashes(tokens) == unset
    assert LMCacheHasher(chunk_size=4, none_hash_seed="0").block_hashes(tokens) != unset


# --- multimodal placeholders (case 3) ---------------------------------------------------

IMG_A = "ab" * 30 + "1234"   # two 64-hex digests sharing their last 4 hex digits
IMG_B = "cd" * 30 + "1234"
PLACEHOLDER = 151655


def _mm_keys(mode: str, mm_placeholder: str, identifier: str) -> list[int]:
    tokens = [1, 2, 3, 4] + [PLACEHOLDER] * 6 + [5, 6]   # image covers [4, 10): chunks 1 and 2
    extras = RequestExtras(mm_items=(MMItem(identifier, offset=4, length=6),))
    hasher = LMCacheHasher(chunk_size=4, mode=mode, mm_placeholder=mm_placeholder)
    return hasher.block_keys(tokens, extras).tolist()


@pytest.mark.parametrize("mode", ["chunked_token_db", "mp_token_hasher"])
def test_images_sharing_last_4_hex_digits_differ_per_position(mode: str) -> None:
    a, b = _mm_keys(mode, "per_position", IMG_A), _mm_keys(mode, "per_position", IMG_B)
    assert a[0] == b[0]                       # text-only first chunk
    assert a[1] != b[1] and a[2] != b[2]      # chunks touching the image differ


@pytest.mark.parametrize("mode", ["chunked_token_db", "mp_token_hasher"])
def test_int16_legacy_reproduces_the_collision(mode: str) -> None:
    """LMCache issues #3301/#4086: the 16-bit reduction keeps only the last 4 hex digits."""
    assert hex_hash_to_int16(IMG_A) == hex_hash_to_int16(IMG_B) == 0x1234
    assert _mm_keys(mode, "int16_legacy", IMG_A) == _mm_keys(mode, "int16_legacy", IMG_B)
    assert _mm_keys(mode, "int16_legacy", IMG_A) != _mm_keys(mode, "per_position", IMG_A)


def test_mm_items_change_keys_only_from_their_chunk() -> None:
    tokens = list(range(100, 112))
    hasher = LMCacheHasher(chunk_size=4)
    plain = hasher.block_hashes(tokens)
    with_image = hasher.block_hashes(tokens, RequestExtras(mm_items=(MMItem(IMG_A, 5, 2),)))
    assert with_image[0] == plain[0] and with_image[1] != plain[1] and with_image[2] != plain[2]


@pytest.mark.parametrize(("identifier", "value"), [
    ("0000", 0), ("ffff", 0xFFFF), ("0xFFFF", 0xFFFF), ("0x0001", 1), ("123456", 0x3456), ("0x123456", 0x3456),
    (" FfFf ", 0xFFFF), ("\n0x00aB\t", 0xAB), ("chatcmpl-a2a48871c4aad192-image-0", 41730), ("0x", 0xA549),
])
def test_hex_hash_to_int16(identifier: str, value: int) -> None:
    assert hex_hash_to_int16(identifier) == value


def test_per_position_values_start_from_the_identifiers_sha256() -> None:
    """Item 1: LMCache expands from sha256(identifier), not from the identifier's bytes."""
    seed = hashlib.sha256(b"img").digest()
    block0 = hashlib.sha256(seed + bytes(8)).digest()
    assert mm_placeholder_values("img", 2) == [int.from_bytes(block0[:4], "big") & 0x7FFFFFFF,
                                               int.from_bytes(block0[4:8], "big") & 0x7FFFFFFF]
    assert mm_placeholder_values("img", 0) == []


@given(st.text(min_size=1, max_size=40), st.integers(0, 80), st.integers(0, 80))
def test_per_position_values_prefix_stable_and_31_bit(identifier: str, m: int, n: int) -> None:
    short, long = sorted((m, n))
    full = mm_placeholder_values(identifier, long)
    assert mm_placeholder_values(identifier, short) == full[:short]
    assert len(full) == long and all(0 <= v < 2**31 for v in full)


def test_per_position_values_distinct_identifiers_differ_nearly_everywhere() -> None:
    a, b = mm_placeholder_values("0x1234", 64), mm_placeholder_values("0x11234", 64)
    assert sum(x == y for x, y in zip(a, b, strict=True)) <= 1
    assert len(set(mm_placeholder_values("some-image-hash", 128))) > 120


def test_apply_mm_placeholders_truncates_skips_and_keeps_text() -> None:
    items = [MMItem("0xbeef", offset=1, length=2), MMItem("x", offset=4, length=10), MMItem("y", offset=20, length=3)]
    out = apply_mm_placeholders(np.arange(6), items, "per_position")
    assert out.tolist() == [0, *mm_placeholder_values("0xbeef", 2), 3, *mm_placeholder_values("x", 2)]
    assert apply_mm_placeholders(range(6), items, "int16_legacy").tolist() == [0, 0xBEEF, 0xBEEF, 3,
                                                                               hex_hash_to_int16("x"),
                                                                               hex_hash_to_int16("x")]


def test_apply_mm_placeholders_in_the_given_order() -> None:
    """LMCache zips identifiers with positions: where spans overlap, the later item wins."""
    first, second = MMItem("a", offset=0, length=3), MMItem("b", offset=1, length=1)
    assert apply_mm_placeholders([0, 0, 0], [first, second]).tolist()[1] == mm_placeholder_values("b", 1)[0]
    assert apply_mm_placeholders([0, 0, 0], [second, first]).tolist()[1] == mm_placeholder_values("a", 2)[1]


def test_hasher_cuts_an_item_at_the_end_of_the_hashed_prefix() -> None:
    """Item 2: LMCache hashes the prefix it saves, cutting an item that runs past it."""
    case = next(c for c in CASES
                if c["name"] == "mm_prefix_cuts_an_item" and "pre_caching_hash_algorithm" in c["params"])
    extras = case_extras(case)
    assert [(item.offset, item.end) for item in extras.mm_items] == [(6, 14), (14, 16)]
    hasher = LMCacheHasher(chunk_size=4)
    prefix = hasher.block_hashes([1, 2, 3, 4, 5, 6, 9, 9, 9, 9], extras)
    assert prefix == case["expected"]["chunk_hashes_int"]
    whole = hasher.block_hashes([1, 2, 3, 4, 5, 6] + [9] * 8 + [7, 7], extras)
    assert whole[:2] == prefix and len(whole) == 4


@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=40), st.integers(0, 40), st.integers(1, 20),
       st.integers(1, 40), st.sampled_from(["chunked_token_db", "mp_token_hasher"]))
def test_prefix_keys_are_the_whole_prompts_first_keys(tokens: list[int], offset: int, length: int, cut: int,
                                                      mode: str) -> None:
    """Per-position values are prefix-stable, so the full chunks of any prefix keep their keys."""
    extras = RequestExtras(mm_items=(MMItem("image-0", offset, length),))
    hasher = LMCacheHasher(chunk_size=4, mode=mode)
    padded = tokens + [0] * max(0, offset + length - len(tokens))
    whole = hasher.block_hashes(padded, extras)
    prefix = hasher.block_hashes(padded[:cut], extras)
    assert prefix == whole[:len(prefix)] and len(prefix) == min(cut, len(padded)) // 4


# --- relation to vLLM ----------------------------------------------------------------------

#: vLLM 0.33's golden block hashes of requests without extra keys, PYTHONHASHSEED unset.
VLLM_CASES = [c for c in json.loads((ROOT / "tests/vectors/vllm_block_hashes.json").read_text())["cases"]
              if "block_size" in c["params"] and c["params"]["PYTHONHASHSEED"] is None
              and not set(c["request"]) - {"token_ids"} and c["params"]["hash_algo"] in ("sha256", "sha256_cbor")]


def test_the_vllm_vectors_used_cover_both_algos_and_several_blocks() -> None:
    assert {c["params"]["hash_algo"] for c in VLLM_CASES} == {"sha256", "sha256_cbor"}
    assert max(len(c["expected"]["block_hashes_hex"]) for c in VLLM_CASES) >= 2


@pytest.mark.parametrize("case", [c for c in VLLM_CASES if c["params"]["hash_algo"] == "sha256_cbor"],
                         ids=lambda c: c["name"])
def test_mp_sha256_cbor_gives_vllm_golden_block_hashes(case: dict) -> None:
    """§4.2: the mp server's sha256_cbor chain is vLLM's block hash at block size = chunk size."""
    mp = LMCacheHasher(chunk_size=case["params"]["block_size"], mode="mp_token_hasher", algo="sha256_cbor")
    assert [h.hex() for h in mp.block_hashes(case["request"]["token_ids"])] == case["expected"]["block_hashes_hex"]


@pytest.mark.parametrize("case", VLLM_CASES, ids=lambda c: f"{c['scheme']}:{c['name']}")
def test_chunked_token_db_never_equals_vllm(case: dict) -> None:
    """§4.1: int prefix and ``()`` instead of vLLM's bytes parent and None: no key coincides with
    vLLM's golden hashes in either int form (LMCache's ``normalize_hash_to_int``, the event u64)."""
    tokens, params = case["request"]["token_ids"], case["params"]
    lm = LMCacheHasher(chunk_size=params["block_size"], algo=params["hash_algo"], save_unfull_chunk=True)
    vllm = ({normalize_hash_to_int(bytes.fromhex(h)) for h in case["expected"]["block_hashes_hex"]}
            | set(case["expected"]["block_hashes_event_u64"]))
    ours = lm.block_hashes(tokens)
    assert len(ours) == -(-len(tokens) // params["block_size"]) and not vllm & set(ours)


# --- chaining ------------------------------------------------------------------------------

@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=30), st.integers(1, 6), st.data(),
       st.sampled_from([("chunked_token_db", "sha256_cbor"), ("chunked_token_db", "xxhash_cbor"),
                        ("mp_token_hasher", "blake3"), ("mp_token_hasher", "sha256")]))
def test_change_in_chunk_j_changes_chunks_from_j_on(tokens: list[int], chunk_size: int, data: st.DataObject,
                                                    mode_algo: tuple[str, str]) -> None:
    mode, algo = mode_algo
    seed = "42" if algo.startswith("xxhash") else None
    hasher = LMCacheHasher(chunk_size=chunk_size, mode=mode, algo=algo, none_hash_seed=seed)
    pos = data.draw(st.integers(0, len(tokens) - 1))
    changed = [*tokens[:pos], (tokens[pos] + 1) % 2**32, *tokens[pos + 1:]]
    before, after = hasher.block_hashes(tokens), hasher.block_hashes(changed)
    assert hasher.block_hashes(list(tokens)) == before
    j = pos // chunk_size
    assert before[:j] == after[:j]
    assert all(x != y for x, y in zip(before[j:], after[j:], strict=True))


def test_save_unfull_chunk_hashes_the_tail() -> None:
    full_only, with_tail = LMCacheHasher(chunk_size=4), LMCacheHasher(chunk_size=4, save_unfull_chunk=True)
    assert with_tail.hashes_partial_tail and not full_only.hashes_partial_tail
    tokens = list(range(10))
    assert len(full_only.block_hashes(tokens)) == 2 and len(with_tail.block_hashes(tokens)) == 3
    assert with_tail.block_hashes(tokens)[:2] == full_only.block_hashes(tokens)
    assert with_tail.num_hashed_blocks(10) == 3 and full_only.num_hashed_blocks(10) == 2


def test_lmcache_keys_ignore_lora_and_salt() -> None:
    """LMCache 0.5.6 chunk hashes take token ids only (the model name sits in CacheEngineKey)."""
    hasher, tokens = LMCacheHasher(chunk_size=4), list(range(8))
    assert hasher.block_hashes(tokens, RequestExtras(lora_name="a", lora_path="/p", cache_salt="s")) == \
        hasher.block_hashes(tokens)


def test_numpy_and_list_tokens_agree() -> None:
    for hasher in (LMCacheHasher(chunk_size=4, algo="sha256"), LMCacheHasher(chunk_size=4, mode="mp_token_hasher")):
        assert hasher.block_hashes(np.arange(9, dtype=np.uint32)) == hasher.block_hashes(list(range(9)))


# --- to_u64 ----------------------------------------------------------------------------------

def test_to_u64() -> None:
    assert LMCacheHasher().to_u64(-6292915440479534054) == 2**64 - 6292915440479534054
    assert LMCacheHasher().to_u64(15403331907661842361) == 15403331907661842361
    assert LMCacheHasher(mode="mp_token_hasher").to_u64(bytes(range(32))) == 0x18191A1B1C1D1E1F
    with pytest.raises(ValueError, match="digest bytes in mode 'mp_token_hasher', got 5"):
        LMCacheHasher(mode="mp_token_hasher").to_u64(5)
    for bad in (b"\x01", True, 2**64, -(2**63) - 1):
        with pytest.raises(ValueError, match="block_hash must be an integer"):
            LMCacheHasher().to_u64(bad)


# --- setups: which hash function and root (item 3) ------------------------------------------

def test_without_vllm_every_algo_is_python_hash_from_root_0() -> None:
    """LMCache's _get_vllm_hash_func falls back to Python's hash() when vLLM is missing: the
    configured algo no longer matters, and the keys are not the sha256_cbor ones from root 0."""
    tokens = list(range(1, 14))
    no_vllm = {algo: LMCacheHasher(chunk_size=4, algo=algo, vllm_importable=False) for algo in
               ("builtin", "sha256", "sha256_cbor", "xxhash", "xxhash_cbor")}
    assert len({tuple(h.block_hashes(tokens)) for h in no_vllm.values()}) == 1
    assert {h.hash_function for h in no_vllm.values()} == {"python_hash"}
    assert {h.none_hash for h in no_vllm.values()} == {0}
    assert no_vllm["sha256_cbor"].name == "lmcache.chunked_token_db.sha256_cbor.no_vllm"
    assert no_vllm["sha256_cbor"].setup == ("vLLM not importable: Python hash() whatever the algo ('sha256_cbor' "
                                            "configured); root 0")
    sha_from_0 = [normalize_hash_to_int(hashlib.sha256(cbor2.dumps((0, (1, 2, 3, 4), ()), canonical=True)).digest())]
    assert no_vllm["sha256_cbor"].block_hashes(tokens)[:1] != sha_from_0


def test_setups_say_which_function_and_root() -> None:
    assert LMCacheHasher().setup == "vLLM importable: vLLM's sha256_cbor; root first 8 bytes of vLLM's NONE_HASH"
    assert LMCacheHasher(algo="builtin", none_hash_seed="0").setup.startswith("Python hash() ('builtin' is no vLLM")
    mp = LMCacheHasher(mode="mp_token_hasher", algo="sha256", vllm_importable=False)
    assert (mp.name, mp.hash_function) == ("lmcache.mp_token_hasher.sha256.no_vllm", "python_hash")
    assert mp.setup.endswith("root hash((0, (0,), None))")
    assert LMCacheHasher(mode="mp_token_hasher", vllm_importable=False).name == "lmcache.mp_token_hasher.blake3"


def test_mp_python_hash_depends_on_hash_of_none() -> None:
    """CPython 3.12+ hashes None to 0xFCA86420; 3.11 to an address, passed as python_none_hash."""
    default = LMCacheHasher(chunk_size=4, mode="mp_token_hasher", algo="builtin", vllm_importable=False)
    assert default.none_hash == python_hash((0, (0,), None), none_hash=0xFCA86420)
    other = LMCacheHasher(chunk_size=4, mode="mp_token_hasher", algo="builtin", vllm_importable=False,
                          python_none_hash=8757973507006)
    assert default.block_hashes(range(8)) != other.block_hashes(range(8))
    assert all(len(h) == 8 for h in default.block_hashes(range(8)))


def _builtin_in_subprocess(pythonhashseed: str) -> str:
    code = ("from kvlab.hashing.lmcache_hash import LMCacheHasher; "
            "print(LMCacheHasher(chunk_size=4, algo='builtin', none_hash_seed='0').block_hashes(list(range(8))))")
    env = {**os.environ, "PYTHONHASHSEED": pythonhashseed, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                          text=True).stdout


def test_builtin_keys_do_not_depend_on_this_process() -> None:
    """kvlab models hash(seed string) from the modelled PYTHONHASHSEED, never this process's hash()."""
    assert _builtin_in_subprocess("1") == _builtin_in_subprocess("7") == _builtin_in_subprocess("random")
    zero = LMCacheHasher(chunk_size=4, algo="builtin", none_hash_seed="0")
    assert str(zero.block_hashes(list(range(8)))) + "\n" == _builtin_in_subprocess("1")
    assert zero.none_hash == python_hash("0", hash_secret=(0, 0))
    assert zero.block_hashes(range(8)) != LMCacheHasher(chunk_size=4, algo="builtin",
                                                        none_hash_seed="42").block_hashes(range(8))


# --- bad input ---------------------------------------------------------------------------------

BAD_PARAMS = [
    ({"chunk_size": 0}, "chunk_size must be an integer >= 1, got 0"),
    ({"mode": "lmcache"}, "mode must be one of ('chunked_token_db', 'mp_token_hasher'), got 'lmcache'"),
    ({"algo": "blake3"}, "algo for mode 'chunked_token_db' must be one of"),
    ({"mode": "mp_token_hasher", "algo": "md5"}, "algo for mode 'mp_token_hasher' must be one of"),
    ({"save_unfull_chunk": 1}, "save_unfull_chunk must be a bool, got 1"),
    ({"vllm_importable": "yes"}, "vllm_importable must be a bool, got 'yes'"),
    ({"mm_placeholder": "int32"}, "mm_placeholder must be one of ('per_position', 'int16_legacy'), got 'int32'"),
    ({"none_hash_seed": 0}, "none_hash_seed must be a str or None, got 0"),
    ({"mode": "mp_token_hasher", "save_unfull_chunk": True}, "hashes full chunks only"),
    ({"vllm_importable": False, "none_hash_seed": "0"}, "none_hash_seed='0' is unused"),
    ({"mode": "mp_token_hasher", "none_hash_seed": "0"}, "none_hash_seed='0' is unused"),
    ({"algo": "xxhash_cbor"}, "algo 'xxhash_cbor' needs an explicit none_hash_seed"),
    ({"algo": "builtin"}, "algo 'builtin' with vllm_importable=True needs none_hash_seed (PYTHONHASHSEED)"),
    ({"mode": "mp_token_hasher", "algo": "builtin"}, "needs none_hash_seed (PYTHONHASHSEED)"),
    ({"algo": "builtin", "none_hash_seed": "random"}, "none_hash_seed='random' with algo 'builtin' is PYTHONHASHSEED"),
    ({"algo": "builtin", "none_hash_seed": "4294967296"}, "integer in [0, 4294967295]"),
    ({"algo": "builtin", "none_hash_seed": "-1"}, "integer in [0, 4294967295]"),
    ({"python_none_hash": 5}, "python_none_hash=5 is unused"),
    ({"mode": "mp_token_hasher", "algo": "sha256", "python_none_hash": 5}, "python_none_hash=5 is unused"),
    ({"mode": "mp_token_hasher", "vllm_importable": False, "python_none_hash": 5}, "python_none_hash=5 is unused"),
    ({"mode": "mp_token_hasher", "vllm_importable": False, "algo": "sha256", "python_none_hash": 2**63},
     "python_none_hash must be an integer"),
]


@pytest.mark.parametrize(("kwargs", "message"), BAD_PARAMS, ids=[str(k) for k, _ in BAD_PARAMS])
def test_bad_params_raise(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        LMCacheHasher(**kwargs)
    assert message in str(info.value)


def test_bad_token_ids_and_extras_raise() -> None:
    with pytest.raises(ValueError, match=r"token_ids must fit 32 bits with algo 'blake3' \(<= 4294967295\), "
                                         r"got 4294967296"):
        LMCacheHasher(chunk_size=2, mode="mp_token_hasher").block_hashes([1, 2**32])
    with pytest.raises(ValueError, match="token_ids must be >= 0, got -1"):
        LMCacheHasher().block_hashes([1, -1])
    with pytest.raises(ValueError, match="token_ids must be one-dimensional"):
        LMCacheHasher().block_hashes([[1, 2]])
    with pytest.raises(ValueError, match="extras must be a RequestExtras or None, got dict"):
        LMCacheHasher().block_hashes([1], {"lora_name": "a"})
    with pytest.raises(ValueError, match="length must be an integer >= 0, got -1"):
        mm_placeholder_values("x", -1)
    with pytest.raises(ValueError, match="identifier must be a str, got None"):
        hex_hash_to_int16(None)
    with pytest.raises(ValueError, match="mm_items must be MMItem values"):
        apply_mm_placeholders([1, 2], [("x", 0, 1)])
    assert LMCacheHasher(chunk_size=2).block_hashes([1, 2**40]) == LMCacheHasher(chunk_size=2).block_hashes(
        [1, 2**40])  # wide tokens are fine for the CBOR / pickle algos
