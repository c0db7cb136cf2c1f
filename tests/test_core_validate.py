"""kvlab.core.validate: one answer to what an integer, a flag, a real and a choice are."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.core.validate import (
    U64_MAX,
    check_choice,
    check_count,
    check_flag,
    check_int,
    check_positive,
    check_real,
    check_rng,
    check_str,
    check_u64,
    rng_from_seed,
)


@pytest.mark.parametrize("value", [3, np.int8(3), np.uint64(3), np.int64(3)])
def test_integers_of_every_kind_are_ints(value):
    out = check_int("n", value, low=0)
    assert out == 3 and type(out) is int


@pytest.mark.parametrize("value", [True, np.True_, 3.0, "3", None, np.float64(3)])
def test_non_integers_are_refused(value):
    with pytest.raises(ValueError, match=r"^n must be an integer, got "):
        check_int("n", value)


@pytest.mark.parametrize(("kwargs", "value", "message"), [
    ({"low": 0}, -1, "n must be an integer >= 0, got -1"),
    ({"low": 1, "high": 4}, 5, "n must be an integer in [1, 4], got 5"),
    ({"high": 4}, 5, "n must be an integer <= 4, got 5"),
    ({"low": 0, "optional": True}, -1, "n must be an integer >= 0 or None, got -1"),
])
def test_integer_bounds_are_named(kwargs, value, message):
    with pytest.raises(ValueError) as err:
        check_int("n", value, **kwargs)
    assert str(err.value) == message


def test_u64_range_is_half_open():
    assert check_u64("key", U64_MAX) == 2**64 - 1
    for bad in (2**64, -1):
        with pytest.raises(ValueError, match=r"key must be an integer in \[0, 2\*\*64\), got "):
            check_u64("key", bad)


def test_count_and_positive():
    assert check_count("c", 0) == 0 and check_positive("p", 1) == 1
    assert check_count("c", None, optional=True) is None
    with pytest.raises(ValueError, match="p must be an integer >= 1, got 0"):
        check_positive("p", 0)


@pytest.mark.parametrize("value", [True, False, np.True_, np.False_])
def test_flags_python_and_numpy(value):
    out = check_flag("f", value)
    assert out is bool(value)


@pytest.mark.parametrize("value", [1, 0, "yes", None, np.int64(1)])
def test_non_flags_are_refused(value):
    with pytest.raises(ValueError, match="f must be a bool, got "):
        check_flag("f", value)


def test_reals():
    assert check_real("x", np.int64(2)) == 2.0 and type(check_real("x", 2)) is float
    assert check_real("x", math.inf, finite=False) == math.inf
    for bad in (math.nan, math.inf, True, "1"):
        with pytest.raises(ValueError, match="x must be a finite number, got "):
            check_real("x", bad)
    with pytest.raises(ValueError, match=r"x must be a number, got nan"):
        check_real("x", math.nan, finite=False)
    with pytest.raises(ValueError, match=r"x must be a finite number > 0, got 0"):
        check_real("x", 0, low=0, low_open=True)
    assert check_real("x", None, optional=True) is None


def test_choice_and_str():
    assert check_choice("mode", "a", ("a", "b")) == "a"
    with pytest.raises(ValueError, match=r"mode must be one of \('a', 'b'\), got 1"):
        check_choice("mode", 1, ("a", "b"))
    assert check_str("s", "") == ""
    with pytest.raises(ValueError, match="s must be a str or None, got 1"):
        check_str("s", 1, optional=True)


@given(st.integers(), st.integers(-5, 5), st.integers(-5, 5))
def test_check_int_accepts_exactly_the_range(value, low, high):
    inside = low <= value <= high
    try:
        assert check_int("n", value, low=low, high=high) == value
        assert inside
    except ValueError:
        assert not inside


def test_rng_and_seed():
    rng = np.random.default_rng(3)
    assert check_rng("rng", rng) is rng and check_rng("rng", None, optional=True) is None
    with pytest.raises(ValueError, match=r"^rng must be a numpy.random.Generator or None \(numpy.random.default_rng"
                                         r"\(seed\)\), got 3$"):
        check_rng("rng", 3, optional=True)
    assert rng_from_seed("seed", rng) is rng
    assert rng_from_seed("seed", np.uint8(5)).integers(1000) == np.random.default_rng(5).integers(1000)
    for bad in (True, 1.0, -1, None):
        with pytest.raises(ValueError, match=rf"^seed must be an integer >= 0 or a numpy.random.Generator, "
                                             rf"got {bad!r}$"):
            rng_from_seed("seed", bad)


@pytest.mark.parametrize(("check", "message"), [
    (lambda: check_int("k", -1, low=-(2**63), high=2**64 - 1), None),
    (lambda: check_int("k", 2**64, low=-(2**63), high=2**64 - 1), "k must be an integer in [-2**63, 2**64), got "),
    (lambda: check_int("k", 2**40, low=0, high=2**32), "k must be an integer in [0, 4294967296], got "),
    (lambda: check_int("k", 2**40, high=2**32 - 1), "k must be an integer < 2**32, got "),
    (lambda: check_real("ts", 2.0**64, low=0.0, high=2.0**64, high_open=True),
     "ts must be a finite number in [0.0, 2**64), got "),
    (lambda: check_real("ts", 10**400, low=0.0), "ts must be a finite number >= 0.0, got 1000"),
    (lambda: check_real("x", 1.0, high=1.0, high_open=True), "x must be a finite number < 1.0, got 1.0"),
])
def test_bounds_read_as_written(check, message):
    if message is None:
        assert check() == -1
        return
    with pytest.raises(ValueError) as err:
        check()
    assert str(err.value).startswith(message)
