"""Argument checks shared by every kvlab package: one signature, ``(name, value, ...)``.

Each check returns the value in its plain Python form (``int``, ``float``, ``bool``, ``str``)
or raises ``ValueError`` naming the argument and the value. One answer everywhere:

* an integer is a Python ``int`` or a numpy integer, never a ``bool``;
* a flag is a Python ``bool`` or a ``numpy.bool_``, never ``0``/``1``;
* a real is an integer or a float (Python or numpy), never a ``bool``; finite unless asked;
* randomness comes from a ``numpy.random.Generator`` (:func:`check_rng`), or from a seed
  (an integer >= 0) that makes one (:func:`rng_from_seed`).

Domain checks (a block owned by a pool, a well-formed trace row) stay beside their model and
build on these.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Iterable, Mapping

import numpy as np

#: The largest unsigned 64-bit key.
U64_MAX = 2**64 - 1


def _bound(value: int | float) -> str:
    """``value`` for a message; ``-2**k`` and a float ``2.0**k`` beyond ``2**15`` read as powers of two."""
    whole = int(value) if isinstance(value, float) and value.is_integer() else value
    if (isinstance(whole, int) and (whole < 0 or isinstance(value, float)) and abs(whole) > 2**15
            and abs(whole) & (abs(whole) - 1) == 0):
        return f"{'-' if whole < 0 else ''}2**{abs(whole).bit_length() - 1}"
    return f"{value}"


def _range(low: object, high: object, *, low_open: bool = False, high_open: bool = False) -> str:
    """`` in [low, high]`` and the like; an integer ``high`` of ``2**k - 1`` (k > 15) reads ``2**k)``."""
    if high is not None and not high_open and isinstance(high, int) and high > 2**15 and (high + 1) & high == 0:
        top = f"2**{(high + 1).bit_length() - 1}"
        high_open = True
    else:
        top = None if high is None else _bound(high)
    if low is not None and high is not None:
        return f" in {'(' if low_open else '['}{_bound(low)}, {top}{')' if high_open else ']'}"
    if low is not None:
        return f" {'>' if low_open else '>='} {_bound(low)}"
    if high is not None:
        return f" {'<' if high_open else '<='} {top}"
    return ""


def check_int(name: str, value: object, *, low: int | None = None, high: int | None = None,
              optional: bool = False) -> int | None:
    """``value`` as an ``int`` when it is an integer (numpy integers too, not a bool) within
    ``[low, high]`` (either bound may be ``None``); ``None`` passes when ``optional``.

    Raises:
        ValueError: names ``name``, the range and the value.

    Example:
        >>> check_int("capacity_blocks", np.int64(8), low=0), check_int("seed", None, optional=True)
        (8, None)
        >>> check_int("block_size", 0, low=1)
        Traceback (most recent call last):
        ValueError: block_size must be an integer >= 1, got 0
    """
    if value is None and optional:
        return None
    if (isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer))
            or (low is not None and value < low) or (high is not None and value > high)):
        none = " or None" if optional else ""
        raise ValueError(f"{name} must be an integer{_range(low, high)}{none}, got {value!r}")
    return int(value)


def check_count(name: str, value: object, *, optional: bool = False) -> int | None:
    """An integer ``>= 0`` (a number of blocks, tokens, requests ...): :func:`check_int` with ``low=0``.

    Example:
        >>> check_count("num_blocks", 3)
        3
    """
    return check_int(name, value, low=0, optional=optional)


def check_positive(name: str, value: object, *, optional: bool = False) -> int | None:
    """An integer ``>= 1`` (a block size, a window): :func:`check_int` with ``low=1``.

    Example:
        >>> check_positive("window_requests", 100)
        100
    """
    return check_int(name, value, low=1, optional=optional)


def check_u64(name: str, value: object) -> int:
    """A 64-bit unsigned key: an integer in ``[0, 2**64)``.

    Raises:
        ValueError: names ``name`` and the value.

    Example:
        >>> check_u64("block_key", -1)
        Traceback (most recent call last):
        ValueError: block_key must be an integer in [0, 2**64), got -1
    """
    return check_int(name, value, low=0, high=U64_MAX)


def check_flag(name: str, value: object) -> bool:
    """``value`` as a ``bool`` when it is a Python or numpy bool (``1`` is not a flag).

    Raises:
        ValueError: names ``name`` and the value.

    Example:
        >>> check_flag("track_orphans", np.True_)
        True
    """
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be a bool, got {value!r}")
    return bool(value)


def check_real(name: str, value: object, *, low: float | None = None, high: float | None = None,
               low_open: bool = False, high_open: bool = False, finite: bool = True,
               optional: bool = False) -> float | None:
    """``value`` as a ``float`` when it is a real number (numpy too, not a bool) within the bounds
    (``low`` excluded when ``low_open``, ``high`` when ``high_open``); finite unless
    ``finite=False``; ``None`` passes when ``optional``.

    Raises:
        ValueError: names ``name``, the range and the value (NaN always refused).

    Example:
        >>> check_real("arrival_s", np.float32(1.5), low=0.0)
        1.5
        >>> check_real("mfu", 0.0, low=0.0, high=1.0, low_open=True)
        Traceback (most recent call last):
        ValueError: mfu must be a finite number in (0.0, 1.0], got 0.0
    """
    if value is None and optional:
        return None
    ok = not isinstance(value, (bool, np.bool_)) and isinstance(value, (int, float, np.integer, np.floating))
    if ok:
        try:
            v = float(value)
        except OverflowError:  # an int beyond the float range
            v = math.inf if value > 0 else -math.inf
        ok = not math.isnan(v) and (not finite or math.isfinite(v))
        ok = (ok and (low is None or (v > low if low_open else v >= low))
              and (high is None or (v < high if high_open else v <= high)))
    if not ok:
        kind = "a finite number" if finite else "a number"
        none = " or None" if optional else ""
        raise ValueError(f"{name} must be {kind}{_range(low, high, low_open=low_open, high_open=high_open)}{none}, "
                         f"got {value!r}")
    return v


def check_choice(name: str, value: object, choices: Collection[str]) -> str:
    """``value`` when it is one of ``choices`` (strings).

    Raises:
        ValueError: names ``name``, the choices and the value.

    Example:
        >>> check_choice("touch_order", "tail", ("head_most_recent", "tail_most_recent"))
        Traceback (most recent call last):
        ValueError: touch_order must be one of ('head_most_recent', 'tail_most_recent'), got 'tail'
    """
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value


def check_list(name: str, values: object) -> list:
    """``values`` (any iterable but a string) as a non-empty ``list``, iterated once.

    Raises:
        ValueError: a string, a non-iterable or an empty iterable (names ``name`` and the value).

    Example:
        >>> check_list("capacities_blocks", range(2))
        [0, 1]
        >>> check_list("policies", [])
        Traceback (most recent call last):
        ValueError: policies is empty: give at least one
    """
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValueError(f"{name} must be a list, got {values!r}")
    values = list(values)
    if not values:
        raise ValueError(f"{name} is empty: give at least one")
    return values


def check_str(name: str, value: object, *, nonempty: bool = False, optional: bool = False) -> str | None:
    """``value`` when it is a ``str`` (non-empty when ``nonempty``); ``None`` passes when ``optional``.

    Raises:
        ValueError: names ``name`` and the value.

    Example:
        >>> check_str("medium", "", nonempty=True)
        Traceback (most recent call last):
        ValueError: medium must be a non-empty str, got ''
    """
    if value is None and optional:
        return None
    if not isinstance(value, str) or (nonempty and not value):
        kind = "a non-empty str" if nonempty else "a str"
        raise ValueError(f"{name} must be {kind}{' or None' if optional else ''}, got {value!r}")
    return value


def check_rng(name: str, value: object, *, optional: bool = False) -> np.random.Generator | None:
    """``value`` when it is a :class:`numpy.random.Generator`; ``None`` passes when ``optional``.

    Raises:
        ValueError: names ``name`` and the value (and how to make a generator).

    Example:
        >>> check_rng("rng", 42)
        Traceback (most recent call last):
        ValueError: rng must be a numpy.random.Generator (numpy.random.default_rng(seed)), got 42
    """
    if value is None and optional:
        return None
    if not isinstance(value, np.random.Generator):
        none = " or None" if optional else ""
        raise ValueError(f"{name} must be a numpy.random.Generator{none} (numpy.random.default_rng(seed)), "
                         f"got {value!r}")
    return value


def rng_from_seed(name: str, seed: object) -> np.random.Generator:
    """A generator from ``seed``: a :class:`numpy.random.Generator` is used as it is (its
    state advances), an integer ``>= 0`` seeds a new one (``numpy.random.default_rng``).

    Raises:
        ValueError: names ``name`` and the value.

    Example:
        >>> float(rng_from_seed("seed", 7).random()) == float(np.random.default_rng(7).random())
        True
        >>> rng_from_seed("seed", -1)
        Traceback (most recent call last):
        ValueError: seed must be an integer >= 0 or a numpy.random.Generator, got -1
    """
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"{name} must be an integer >= 0 or a numpy.random.Generator, got {seed!r}")
    return np.random.default_rng(int(seed))


def config_with(kind: type, config: object, overrides: Mapping[str, object]) -> object:
    """``config`` (an instance of the dataclass ``kind``, or ``None`` for its defaults) with the
    keyword ``overrides`` replacing its fields (through its own ``replace`` method when it has
    one, e.g. to derive defaults again); the new instance validates itself.

    Raises:
        ValueError: ``config`` of another type, or an override that names no field of ``kind``
            (the message lists the fields).

    Example:
        >>> from dataclasses import dataclass
        >>> @dataclass(frozen=True)
        ... class Toy:
        ...     capacity_blocks: int = 1
        >>> config_with(Toy, None, {"capacity_blocks": 4})
        Toy(capacity_blocks=4)
        >>> config_with(Toy, None, {"capcity_blocks": 4})
        Traceback (most recent call last):
        ...
        ValueError: Toy has no field 'capcity_blocks'; fields: ['capacity_blocks']
    """
    if config is not None and type(config) is not kind:
        raise ValueError(f"config must be a {kind.__name__} or None, got {config!r}")
    names = [f.name for f in dataclasses.fields(kind)]
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        raise ValueError(f"{kind.__name__} has no field {unknown[0]!r}; fields: {sorted(names)}")
    if config is None:
        return kind(**overrides)
    rebuild = getattr(config, "replace", None)  # a config that derives fields rebuilds itself
    return rebuild(**overrides) if callable(rebuild) else dataclasses.replace(config, **overrides)
