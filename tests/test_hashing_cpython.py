"""kvlab's model of CPython's hash() against CPython's own: ints and tuples in this process, str and
bytes in subprocesses under fixed PYTHONHASHSEED values (the only place a test calls hash())."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.hashing.cpython_hash import (
    HASH_MODULUS,
    hash_secret_from_pythonhashseed,
    python_hash,
)

ROOT = Path(__file__).resolve().parents[1]
CPYTHON_64 = pytest.mark.skipif(sys.implementation.name != "cpython" or sys.maxsize != 2**63 - 1,
                                reason="the model is CPython's 64-bit hash")
ints = st.integers(-(2**70), 2**70)
values = st.recursive(ints, lambda inner: st.lists(inner, max_size=6).map(tuple), max_leaves=40)


@CPYTHON_64
@given(values)
def test_ints_and_nested_tuples_match_cpython(value: object) -> None:
    assert python_hash(value) == hash(value)


@CPYTHON_64
@pytest.mark.parametrize("value", [0, -1, -2, 1, HASH_MODULUS - 1, HASH_MODULUS, -HASH_MODULUS, 2**64 - 1,
                                   -(2**63), (), ((),), (-1,), tuple(range(256)), (0, (0,), ()), True])
def test_edge_values_match_cpython(value: object) -> None:
    assert python_hash(value) == hash(value)


@CPYTHON_64
def test_none_is_the_given_value() -> None:
    assert python_hash(None, none_hash=hash(None)) == hash(None)
    assert python_hash((1, None), none_hash=hash(None)) == hash((1, None))
    assert python_hash(None) == 0xFCA86420  # CPython 3.12+


STRINGS = ["", "a", "0", "42", "vllm-none-hash", "abcdefgh", "abcdefghi", "é", "Āx", "€uro", "😀", "a😀\u0100",
           "\ud800"]


def _cpython_hashes(seed: str) -> list[int]:
    code = ("import json, sys; strings = json.loads(sys.argv[1]); "
            "print(json.dumps([hash(s) for s in strings] + [hash(s.encode('utf-8', 'surrogatepass')) for s in strings]"
            " + [hash((1, s, (s,))) for s in strings]))")
    env = {**os.environ, "PYTHONHASHSEED": seed}
    out = subprocess.run([sys.executable, "-c", code, json.dumps(STRINGS)], env=env, check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out)


@CPYTHON_64
@pytest.mark.skipif(sys.version_info < (3, 11), reason="CPython 3.11 switched str hashing to SipHash-1-3")
@pytest.mark.parametrize("seed", ["0", "1", "42", "4294967295", "007"])
def test_str_and_bytes_match_cpython_under_pythonhashseed(seed: str) -> None:
    secret = hash_secret_from_pythonhashseed(int(seed))
    ours = ([python_hash(s, hash_secret=secret) for s in STRINGS]
            + [python_hash(s.encode("utf-8", "surrogatepass"), hash_secret=secret) for s in STRINGS]
            + [python_hash((1, s, (s,)), hash_secret=secret) for s in STRINGS])
    assert ours == _cpython_hashes(seed)


def test_hash_secret_from_pythonhashseed() -> None:
    assert hash_secret_from_pythonhashseed(0) == (0, 0)
    k0, k1 = hash_secret_from_pythonhashseed(1)
    assert k0.to_bytes(8, "little")[:2] == bytes([(214013 + 2531011) >> 16 & 0xFF,
                                                  ((214013 + 2531011) * 214013 + 2531011) >> 16 & 0xFF])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"value": "s"}, "depends on the process's hash secret (PYTHONHASHSEED): pass hash_secret"),
    ({"value": 1.5}, "python_hash models int, None, str, bytes and tuples of them, got float"),
    ({"value": [1]}, "got list"),
])
def test_bad_values_raise(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        python_hash(**kwargs)
    assert message in str(info.value)


@pytest.mark.parametrize("seed", [-1, 2**32, "1", True])
def test_bad_pythonhashseed_raises(seed: object) -> None:
    with pytest.raises(ValueError, match="seed must be an integer"):
        hash_secret_from_pythonhashseed(seed)  # type: ignore[arg-type]
