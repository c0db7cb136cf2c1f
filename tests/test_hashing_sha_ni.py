"""SHA-256 engines inside kernels (kvlab.hashing.sha_ni) and the array form of vLLM's hashes."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from kvlab.hashing import MMItem, RequestExtras, sha_ni, vllm
from kvlab.hashing.libcrypto import CTX_BYTES

ENGINES = [e for e in ("sha_ni", "libcrypto") if e != "sha_ni" or sha_ni.host_has_sha_ni()]


def _spliced_kernel(offset: int):  # noqa: ANN202 - a numba kernel for one literal offset
    @njit
    def run(functions, message, parent):  # noqa: ANN001, ANN202
        buf = np.zeros(message.shape[0] + 128, np.uint8)
        buf[:message.shape[0]] = message
        ctx, out = np.zeros(CTX_BYTES, np.uint8), np.zeros(32, np.uint8)
        base = np.uint64(buf.ctypes.data)
        chunks = sha_ni.pad_sha256(base, message.shape[0])
        sha_ni.sha256_spliced(functions, np.uint64(ctx.ctypes.data), base, message.shape[0], chunks,
                              np.uint64(parent.ctypes.data), np.uint64(out.ctypes.data), offset)
        return out

    return run


KERNELS = {offset: _spliced_kernel(offset) for offset in (0, 3, 13, 32)}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("offset", sorted(KERNELS))
@settings(max_examples=60)
@given(data=st.data())
def test_spliced_digest_equals_hashlib(engine: str, offset: int, data: st.DataObject) -> None:
    """Any message length from the parent's end to five chunks; the buffer's own bytes
    where the parent goes never matter."""
    length = data.draw(st.integers(offset + 32, 320))
    message = np.frombuffer(data.draw(st.binary(min_size=length, max_size=length)), np.uint8).copy()
    parent = np.frombuffer(data.draw(st.binary(min_size=32, max_size=32)), np.uint8).copy()
    want = bytearray(message.tobytes())
    want[offset:offset + 32] = parent.tobytes()
    got = KERNELS[offset](sha_ni.engine_functions(engine), message, parent)
    assert got.tobytes() == hashlib.sha256(bytes(want)).digest()


def test_known_digest_through_each_engine() -> None:
    """FIPS 180-4 example "abc" padded to one chunk, parent = 32 zero bytes at offset 3."""
    message = np.frombuffer(b"abc" + bytes(32) + b"xyz", np.uint8).copy()
    for engine in ENGINES:
        out = KERNELS[3](sha_ni.engine_functions(engine), message, np.zeros(32, np.uint8))
        assert out.tobytes() == hashlib.sha256(b"abc" + bytes(32) + b"xyz").digest()


def test_engine_functions_rejects_unknown_engines() -> None:
    assert sha_ni.engine_functions("sha_ni") is None
    assert sha_ni.engine_functions("libcrypto").dtype == np.uint64
    with pytest.raises(ValueError, match="engine must be"):
        sha_ni.engine_functions("md5")


def test_padding_layout() -> None:
    buf = np.full(256, 0xAA, np.uint8)
    assert sha_ni.pad_sha256(np.uint64(buf.ctypes.data), 55) == 1
    assert buf[55] == 0x80 and buf[56:64].tobytes() == (55 * 8).to_bytes(8, "big")
    buf[:] = 0xAA
    assert sha_ni.pad_sha256(np.uint64(buf.ctypes.data), 56) == 2
    assert buf[56] == 0x80 and not buf[57:120].any() and buf[120:128].tobytes() == (56 * 8).to_bytes(8, "big")


EXTRAS = [None, RequestExtras(lora_name="ad", cache_salt="s"), RequestExtras(mm_items=(MMItem("img", 3, 20),))]


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"])
@pytest.mark.parametrize("extras", EXTRAS)
def test_block_hash_array_and_keys_match_the_list(algo: str, extras: RequestExtras | None) -> None:
    hasher = vllm(algo, seed="0", block_size=16)
    tokens = np.random.default_rng(3).integers(0, 2**40, size=333)
    hashes = hasher.block_hashes(tokens, extras)
    rows = hasher.block_hash_array(tokens, extras)
    assert rows.dtype == np.uint8 and rows.shape == (20, 32 if algo.startswith("sha") else 16)
    assert [bytes(row) for row in rows] == hashes
    assert hasher.block_keys(tokens, extras).tolist() == [hasher.to_u64(h) for h in hashes]
    assert hasher.block_hash_array(tokens[:15]).shape == (0, rows.shape[1])
    assert hasher.block_keys(tokens[:15]).dtype == np.uint64


def test_block_hash_array_without_an_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    import kvlab.hashing.vllm_pickle as vllm_pickle

    hasher, tokens = vllm(block_size=16), np.arange(100) * 7919
    fast = hasher.block_hash_array(tokens)
    monkeypatch.setattr(vllm_pickle, "sha256_engine", lambda: None)
    slow = hasher.block_hash_array(tokens)
    assert slow.shape == (6, 32) and (slow == fast).all() and slow.flags.writeable
