"""Where a value sits in a JSON document's text: the line an error names when a trace format is
one JSON document per file (pretty-printed or on one line), found only when an error is raised.

``json.loads`` keeps no positions; these walk the text with the standard library's own decoder
(``raw_decode`` skips each value at C speed), so they cost a pass over the text, no more.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from json.decoder import scanstring

_DECODER = json.JSONDecoder()
_WHITE = " \t\n\r"
PathPart = str | int


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WHITE:
        i += 1
    return i


def members(text: str, start: int) -> Iterator[tuple[str, int, int]]:
    """``(key, value start, value end)`` of each member of the object whose ``{`` is at ``start``
    (character offsets into ``text``; duplicate keys each yielded)."""
    i = _skip(text, start + 1)
    if text[i] == "}":
        return
    while True:
        key, i = scanstring(text, i + 1)
        i = _skip(text, _skip(text, i) + 1)  # past the colon
        _, end = _DECODER.raw_decode(text, i)
        yield key, i, end
        i = _skip(text, end)
        if text[i] == "}":
            return
        i = _skip(text, i + 1)  # past the comma


def elements(text: str, start: int) -> Iterator[tuple[int, int]]:
    """``(value start, value end)`` of each element of the array whose ``[`` is at ``start``."""
    i = _skip(text, start + 1)
    if text[i] == "]":
        return
    while True:
        _, end = _DECODER.raw_decode(text, i)
        yield i, end
        i = _skip(text, end)
        if text[i] == "]":
            return
        i = _skip(text, i + 1)


def offset_of(text: str, path: Sequence[PathPart]) -> int:
    """Character offset of the value at ``path`` (keys and indexes from the root) in ``text``, a
    valid JSON document; as deep as the path exists (a missing key or index stops at its parent;
    a repeated key: the last, as ``json.loads`` keeps).

    Example:
        >>> offset_of('{"a": [1, {"b": 2}]}', ["a", 1, "b"])
        16
    """
    pos = _skip(text, 0)
    for part in path:
        found = None
        if isinstance(part, str) and text[pos] == "{":
            for key, start, _ in members(text, pos):
                if key == part:
                    found = start
        elif isinstance(part, int) and text[pos] == "[":
            for index, (start, _) in enumerate(elements(text, pos)):
                if index == part:
                    found = start
                    break
        if found is None:
            return pos
        pos = found
    return pos


def line_of(text: str, path: Sequence[PathPart]) -> int:
    """1-based line of the value at ``path`` (see :func:`offset_of`); 1 for a one-line document
    without walking it.

    Example:
        >>> line_of('{\\n "requests": [\\n  {"in": 5},\\n  {"in": -5}\\n ]\\n}', ["requests", 1, "in"])
        4
    """
    if "\n" not in text.rstrip():
        return 1
    return text.count("\n", 0, offset_of(text, path)) + 1
