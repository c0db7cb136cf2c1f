"""vLLM sha256 chains through each SHA-256 engine (the CPU's SHA extensions, libcrypto) and
their pure-Python fallback."""

from __future__ import annotations

import hashlib
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import kvlab.hashing.vllm_cbor as vllm_cbor
import kvlab.hashing.vllm_pickle as vllm_pickle
from kvlab.hashing import libcrypto, sha_ni, vllm
from kvlab.hashing.digests import DEFAULT_NONE_HASH_SEED, none_hash

ROOT = none_hash("sha256", DEFAULT_NONE_HASH_SEED)
TOKENS = st.one_of(st.integers(0, 300), st.integers(0, 2**31), st.integers(0, 2**64 - 1))
#: Every engine this machine has (the project's machines have both).
ENGINES = [e for e in ("sha_ni", "libcrypto") if e != "sha_ni" or sha_ni.host_has_sha_ni()]


def use_engine(monkeypatch: pytest.MonkeyPatch, engine: str) -> None:
    """Make the pickle and CBOR chains hash with ``engine``."""
    for module in (vllm_pickle, vllm_cbor):
        monkeypatch.setattr(module, "sha256_engine", lambda: engine)


def pickle_chain(parent: bytes, rows: list[list[int]]) -> list[bytes]:
    """vLLM 0.33 ``hash_block_tokens`` with ``sha256``, written out: the reference recipe."""
    out = []
    for row in rows:
        parent = hashlib.sha256(pickle.dumps((parent, tuple(row), None), protocol=5)).digest()
        out.append(parent)
    return out


def test_libcrypto_is_found_where_hashlib_uses_openssl() -> None:
    """This machine's Python links hashlib to OpenSSL: the fast path must not silently fall back."""
    import _hashlib  # noqa: F401 - present on the project's machines

    functions = libcrypto.sha256_functions()
    assert functions is not None and functions.dtype == np.uint64 and (functions > 0).all()


@pytest.mark.parametrize("engine", ENGINES)
@given(block_size=st.integers(1, 20), data=st.data())
def test_kernel_chain_equals_pickle(engine: str, block_size: int, data: st.DataObject) -> None:
    """Pickles of 1 to 5 SHA-256 chunks (every padding boundary), every integer opcode."""
    rows = data.draw(st.lists(st.lists(TOKENS, min_size=block_size, max_size=block_size), max_size=6))
    blocks = np.array(rows, dtype=np.uint64).reshape(len(rows), block_size)
    expected = pickle_chain(ROOT, rows)
    with pytest.MonkeyPatch.context() as monkeypatch:
        use_engine(monkeypatch, engine)
        assert vllm_pickle.chain_without_extras("sha256", ROOT, blocks) == expected
        assert vllm_pickle.chain_without_extras("sha256", ROOT, blocks[:0]) == []
        digests = vllm_pickle.sha256_chain_array(ROOT, blocks)
        assert digests.shape == (len(rows), 32) and [bytes(row) for row in digests] == expected


@pytest.mark.parametrize("engine", ENGINES)
def test_kernel_chain_over_many_word_batches(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """More blocks than one batch of token words (64 blocks), token sizes mixed."""
    rng = np.random.default_rng(5)
    blocks = (rng.integers(0, 2**31, size=(150, 16)) >> rng.integers(0, 31, size=(150, 16))).astype(np.uint64)
    use_engine(monkeypatch, engine)
    assert vllm_pickle.chain_without_extras("sha256", ROOT, blocks) == pickle_chain(ROOT, blocks.tolist())


def test_engines_give_the_same_array() -> None:
    blocks = np.arange(33 * 16, dtype=np.uint64).reshape(33, 16) * np.uint64(977)
    arrays = []
    for engine in ENGINES:
        with pytest.MonkeyPatch.context() as monkeypatch:
            use_engine(monkeypatch, engine)
            arrays.append(vllm_pickle.sha256_chain_array(ROOT, blocks))
    assert len(arrays) == 2 and (arrays[0] == arrays[1]).all()


def test_this_machine_uses_its_sha_extensions() -> None:
    """The project's machines have x86 SHA extensions: the fast engine must not silently fall back."""
    assert sha_ni.host_has_sha_ni() and sha_ni.sha256_engine.__wrapped__() == "sha_ni"


def test_fallback_without_libcrypto_gives_the_same_digests(monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = np.arange(64, dtype=np.uint64).reshape(4, 16) * np.uint64(40_009)
    fast = vllm_pickle.chain_without_extras("sha256", ROOT, blocks)
    monkeypatch.setattr(vllm_pickle, "sha256_engine", lambda: None)
    assert vllm_pickle.chain_without_extras("sha256", ROOT, blocks) == fast == pickle_chain(ROOT, blocks.tolist())


def test_no_library_means_no_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(libcrypto, "_hashlib_libcrypto", lambda: "/nonexistent/libcrypto.so.3")
    monkeypatch.setattr(libcrypto.ctypes.util, "find_library", lambda name: None)
    assert libcrypto.sha256_functions.__wrapped__() is None


def test_a_library_giving_other_digests_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The load-time check: a library whose SHA256_* disagree with hashlib is not used."""
    monkeypatch.setattr(libcrypto, "_NAMES", ("SHA224_Init", "SHA224_Update", "SHA224_Final"))
    assert libcrypto.sha256_functions.__wrapped__() is None


def test_digest_rows_ending_in_zero_keep_their_32_bytes() -> None:
    digests = np.arange(96, dtype=np.uint8).reshape(3, 32)
    digests[1, 28:] = 0
    assert vllm_pickle.digest_list(digests) == [bytes(row) for row in digests.tolist()]
    assert len(vllm_pickle.digest_list(digests)[1]) == 32


CBOR_TOKENS = st.one_of(st.integers(0, 30), st.integers(0, 70_000), st.integers(0, 2**33), st.integers(0, 2**64 - 1))


@pytest.mark.parametrize("engine", ENGINES)
@given(block_size=st.sampled_from([1, 2, 16, 23, 24, 255, 256]), data=st.data())
def test_sha256_cbor_kernel_equals_cbor2(engine: str, block_size: int, data: st.DataObject) -> None:
    """Every CBOR head form (immediate, 1/2/4/8-byte argument; array heads 80+B, 98, 99)."""
    import cbor2

    rows = data.draw(st.lists(st.lists(CBOR_TOKENS, min_size=block_size, max_size=block_size), max_size=4))
    blocks = np.array(rows, dtype=np.uint64).reshape(len(rows), block_size)
    parent, expected = none_hash("sha256_cbor", DEFAULT_NONE_HASH_SEED), []
    for row in rows:
        expected.append(parent := hashlib.sha256(cbor2.dumps((parent, tuple(row), None), canonical=True)).digest())
    root = none_hash("sha256_cbor", DEFAULT_NONE_HASH_SEED)
    with pytest.MonkeyPatch.context() as monkeypatch:
        use_engine(monkeypatch, engine)
        assert vllm_cbor.chain_sha256_cbor(root, blocks) == expected


def test_sha256_cbor_profile_falls_back_to_cbor2_without_libcrypto(monkeypatch: pytest.MonkeyPatch) -> None:
    hasher = vllm(algo="sha256_cbor", block_size=16)
    tokens = np.arange(80, dtype=np.int64) * 3001
    fast = hasher.block_hashes(tokens)
    monkeypatch.setattr(vllm_cbor, "sha256_engine", lambda: None)
    assert vllm_cbor.chain_sha256_cbor(bytes(32), np.zeros((1, 2), np.uint64)) is None
    assert hasher.block_hashes(tokens) == fast and len(fast) == 5


@pytest.mark.parametrize(("parent", "blocks", "message"), [
    (bytes(31), np.zeros((1, 2), np.uint64), "parent must be a 32-byte sha256 digest"),
    (bytes(32), np.zeros((1, 2), np.int64), "blocks must be a uint64"),
    (bytes(32), np.zeros(2, np.uint64), "blocks must be a uint64"),
])
def test_sha256_cbor_bad_input(parent, blocks, message) -> None:
    with pytest.raises(ValueError, match=message):
        vllm_cbor.chain_sha256_cbor(parent, blocks)
