"""vLLM sha256 chains through libcrypto (kvlab.hashing.libcrypto) and their fallback."""

from __future__ import annotations

import hashlib
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import kvlab.hashing.vllm_pickle as vllm_pickle
from kvlab.hashing import libcrypto
from kvlab.hashing.digests import DEFAULT_NONE_HASH_SEED, none_hash

ROOT = none_hash("sha256", DEFAULT_NONE_HASH_SEED)
TOKENS = st.one_of(st.integers(0, 300), st.integers(0, 2**31), st.integers(0, 2**64 - 1))


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


@given(block_size=st.integers(1, 20), data=st.data())
def test_libcrypto_chain_equals_pickle_and_the_fallback(block_size: int, data: st.DataObject) -> None:
    rows = data.draw(st.lists(st.lists(TOKENS, min_size=block_size, max_size=block_size), max_size=6))
    blocks = np.array(rows, dtype=np.uint64).reshape(len(rows), block_size)
    expected = pickle_chain(ROOT, rows)
    assert vllm_pickle.chain_without_extras("sha256", ROOT, blocks) == expected
    assert vllm_pickle.chain_without_extras("sha256", ROOT, blocks[:0]) == []


def test_fallback_without_libcrypto_gives_the_same_digests(monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = np.arange(64, dtype=np.uint64).reshape(4, 16) * np.uint64(40_009)
    fast = vllm_pickle.chain_without_extras("sha256", ROOT, blocks)
    monkeypatch.setattr(vllm_pickle, "sha256_functions", lambda: None)
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
    assert vllm_pickle._digest_list(digests) == [bytes(row) for row in digests.tolist()]
    assert len(vllm_pickle._digest_list(digests)[1]) == 32
