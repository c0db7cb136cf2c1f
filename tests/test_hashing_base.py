"""The shared request description (RequestExtras, MMItem) and input checks of kvlab.hashing."""

from __future__ import annotations

import numpy as np
import pytest

from kvlab.hashing import MMItem, RequestExtras, sim
from kvlab.hashing.base import as_token_array, check_block_size, resolve_extras


def test_mm_item_numpy_integers_become_python_ints() -> None:
    item = MMItem("img", np.int64(5), np.uint64(6))
    assert item == MMItem("img", 5, 6) and type(item.offset) is int and type(item.length) is int


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"identifier": "  ", "offset": 0, "length": 1}, "identifier must not be blank, got '  '"),
    ({"identifier": "x", "offset": -1, "length": 1}, "offset must be an integer >= 0, got -1"),
    ({"identifier": "x", "offset": 0, "length": 0}, "length must be an integer >= 1, got 0"),
    ({"identifier": "x", "offset": 1.0, "length": 1}, "offset must be an integer >= 0, got 1.0"),
])
def test_bad_mm_items(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        MMItem(**kwargs)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"lora_name": ""}, "lora_name must be a non-empty str or None, got ''"),
    ({"lora_name": "a", "lora_path": ""}, "lora_path must be a non-empty str or None, got ''"),
    ({"lora_path": "/p"}, "lora_path / lora_identity need a lora_name"),
    ({"lora_identity": "d"}, "lora_path / lora_identity need a lora_name"),
    ({"lora_name": 5}, "lora_name must be a non-empty str or None, got 5"),
    ({"mm_items": 5}, "mm_items must be a sequence of MMItem, got 5"),
    ({"mm_items": MMItem("a", 0, 1)}, "mm_items must be a sequence of MMItem"),
    ({"mm_items": ["a"]}, "mm_items must be MMItem values"),
    ({"mm_items": [MMItem("a", 0, 4), MMItem("b", 2, 4)]}, "mm_items overlap"),
    ({"mm_items": [MMItem("a", 0, 4), MMItem("a", 0, 4)]}, "mm_items overlap"),
    ({"prompt_embeds": "x"}, "prompt_embeds must be an array or a mapping"),
])
def test_bad_request_extras(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        RequestExtras(**kwargs)


def test_request_extras_normalise() -> None:
    extras = RequestExtras(mm_items=[MMItem("b", 9, 1), MMItem("a", 2, 3)], cache_salt="")
    assert [item.identifier for item in extras.mm_items] == ["a", "b"]
    assert extras.cache_salt is None and RequestExtras(mm_items=None).is_empty
    assert RequestExtras(mm_items=[MMItem("a", 0, 2), MMItem("a", 2, 2)]).mm_items[1].offset == 2  # same image twice


def test_resolve_extras() -> None:
    assert resolve_extras(None, 4).is_empty
    with pytest.raises(ValueError, match=r"mm item MMItem\(identifier='a', offset=2, length=4\) ends after the prompt "
                                         r"\(5 tokens\)"):
        resolve_extras(RequestExtras(mm_items=[MMItem("a", 2, 4)]), 5)
    with pytest.raises(ValueError, match="extras must be a RequestExtras or None, got str"):
        resolve_extras("x", 4)
    with pytest.raises(ValueError, match="extras must be a RequestExtras or None, got str"):
        sim(4).block_keys([1, 2, 3, 4], "x")


def test_token_arrays() -> None:
    assert as_token_array([2**63, 1]).dtype == np.uint64
    assert as_token_array(np.array([1, 2], dtype=np.uint8)).dtype == np.int64
    for bad, message in [([2**64], r"token_ids\[0\] must be an integer in \[0, 2\*\*64\), got 18446744073709551616"),
                         ([1, 2.5], r"token_ids\[1\] must be an integer in \[0, 2\*\*64\), got 2.5"),
                         ([True, False], "must be integers"), (np.array([1.0]), "must be integers, got dtype float64"),
                         (np.array([True]), "must be integers, got dtype bool"), ([[1, 2]], "one-dimensional"),
                         ([-1], "must be >= 0, got -1"), (["a"], "must be integers, got dtype <U1")]:
        with pytest.raises(ValueError, match=message):
            as_token_array(bad)


def test_block_size_and_counts() -> None:
    assert check_block_size(np.int32(16)) == 16
    with pytest.raises(ValueError, match=r"block_size must be below 2\*\*31, got 2147483648"):
        check_block_size(2**31)
    for bad in (-5, 2.5, "x"):
        with pytest.raises(ValueError, match="num_tokens must be an integer >= 0"):
            sim(4).num_hashed_blocks(bad)
