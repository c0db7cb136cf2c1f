"""vLLM 0.33 extra keys: what besides tokens goes into a block hash, and how KV events show it.

``generate_block_hash_extra_keys`` (docs/specs/hashing.md §1.5) builds, for the block
of tokens ``[start, end)``, the tagged keys ``lora + mm + cache_salt + prompt_embeds``::

    ("lora", lora_name, lora_path)        every block of a LoRA request
    ("mm", identifier, offset - start)    MM items overlapping the block (scan: mm_keys)
    ("cache_salt", salt)                  the block starting at token 0, non-empty salt only
    ("prompt_embeds", sha256 digest)      rows [start, end) of the prompt embeddings

and hashes ``tuple(keys)``, or ``None`` when there are none. KV events publish them
untagged (``to_event_extra_keys``, §1.7): ``(identifier, offset)``, the bare LoRA name,
the bare salt, the bare digest.

Pickle memoises by object *identity*: a ``str`` object that occurs twice in one hashed
tuple is written once, then referenced. vLLM's user strings (LoRA name and path, MM
identifiers, salt) come from separate request fields and objects, so they are distinct
objects, while its tag literals (``"lora"``, ``"mm"``, ``"cache_salt"``,
``"prompt_embeds"``) are interned and shared. kvlab builds the keys the same way: every
user-provided string occurrence is a fresh copy (:func:`fresh_str`), every tag a literal,
so keys depend only on string *values*, never on whether the caller passed one object
or several equal ones.
"""

from __future__ import annotations

import hashlib

import numpy as np

from kvlab.hashing.base import MMItem, RequestExtras

#: Tagged extra key of one block, e.g. ``("mm", "img-0", -3)``.
ExtraKey = tuple[object, ...]


def fresh_str(value: str) -> str:
    """A new ``str`` object equal to ``value``, as vLLM sees a string decoded from its own
    request field (so pickle never memoises two user strings into one).

    Edge: CPython caches the empty string and one-character strings below U+0100 as
    singletons, so for those the result *is* the shared object (as it is in vLLM when the
    strings come from JSON): two equal such values in one block are pickled as a memo
    reference — the same bytes whatever objects the caller passed.

    Example:
        >>> s = "tenant-a"
        >>> fresh_str(s) == s, fresh_str(s) is s
        (True, False)
    """
    return value.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass")


def check_extras(extras: object) -> RequestExtras | None:
    """``extras`` if it is ``None`` or a valid :class:`RequestExtras` for vLLM.

    (:class:`RequestExtras` itself already rejects a LoRA path or identity without a name.)

    Raises:
        ValueError: not a ``RequestExtras``; prompt embeddings that are not a 2-D array
            of a numeric dtype (an object or string array's bytes are pointers or
            padding, not values).
    """
    if extras is None:
        return None
    if not isinstance(extras, RequestExtras):
        raise ValueError(f"extras must be a RequestExtras or None, got {type(extras).__name__}")
    embeds = extras.prompt_embeds
    if isinstance(embeds, np.ndarray) and embeds.ndim != 2:
        raise ValueError(f"extras.prompt_embeds must be a (num_tokens, hidden) array, got shape {embeds.shape}")
    if isinstance(embeds, np.ndarray) and not np.issubdtype(embeds.dtype, np.number):
        raise ValueError(f"extras.prompt_embeds must have a numeric dtype (its raw bytes are hashed), got dtype "
                         f"{embeds.dtype}")
    return extras


def lora_keys(extras: RequestExtras) -> list[ExtraKey]:
    """The LoRA keys added to every block (``_gen_lora_extra_hash_keys``).

    vLLM 0.33 keys on ``("lora", lora_name, lora_path)`` (a missing path is vLLM's
    default ``""``); the strings are fresh copies (:func:`fresh_str`). With
    ``lora_identity`` set, the keys become ``("lora", name)`` then ``("lora_identity",
    identity)``: the fix of vLLM PR #48352 for stale reuse after an adapter is reloaded
    in place under the same name and path (issue #42125).

    Example:
        >>> lora_keys(RequestExtras(lora_name="ad", lora_path="/p/ad"))
        [('lora', 'ad', '/p/ad')]
    """
    if extras.lora_name is None:
        return []
    name = fresh_str(extras.lora_name)
    if extras.lora_identity is not None:
        return [("lora", name), ("lora_identity", fresh_str(extras.lora_identity))]
    return [("lora", name, fresh_str(extras.lora_path) if extras.lora_path is not None else "")]


def mm_keys(items: tuple[MMItem, ...], start: int, end: int, cursor: int) -> tuple[list[ExtraKey], int]:
    """MM keys of the block ``[start, end)``, scanning ``items`` (sorted by offset) from ``cursor``.

    Models ``_gen_mm_extra_hash_keys``: an item that ends at or before ``start`` is
    passed; an item that starts before ``end`` is keyed ``("mm", identifier, offset -
    start)`` (negative when it began in an earlier block); the scan moves past it only if
    ``end`` reaches the item's end, and otherwise stops there; it stops at the first item
    starting at or after ``end``. The returned cursor is where the next block resumes.
    Each key holds a fresh copy of the identifier (:func:`fresh_str`).

    Example:
        >>> items = (MMItem("img-0", 5, 6), MMItem("img-1", 12, 2))
        >>> mm_keys(items, 8, 12, 0)
        ([('mm', 'img-0', -3)], 1)
    """
    keys: list[ExtraKey] = []
    while cursor < len(items):
        item = items[cursor]
        if end <= item.offset:
            break
        if start >= item.end:
            cursor += 1
            continue
        keys.append(("mm", fresh_str(item.identifier), item.offset - start))
        if end < item.end:
            break
        cursor += 1
    return keys, cursor


class BlockExtraKeys:
    """Tagged extra keys of a request's blocks, block after block (a scan cursor over the
    MM items, as vLLM's request block hasher keeps one).

    Models vLLM 0.33 ``generate_block_hash_extra_keys`` (docs/specs/hashing.md §1.5) for
    consecutive full blocks. vLLM's ``request_block_hasher`` (in the source read) restarts the MM
    scan at the *last* item when a later call hashes blocks completed by generated tokens
    (``curr_mm_idx = -1``), which can drop an earlier item still overlapping such a block;
    kvlab keeps the cursor, so hashing a request as its tokens arrive always equals
    hashing it at once.

    Args:
        extras: the request's extras, or ``None``.
        block_size: tokens per block (≥ 1, already validated).

    Raises:
        ValueError: invalid extras (see :func:`check_extras`).

    Example:
        >>> keys = BlockExtraKeys(RequestExtras(cache_salt="s", mm_items=(MMItem("i", 3, 2),)), 4)
        >>> keys.next_blocks(2)
        [(('mm', 'i', 3), ('cache_salt', 's')), (('mm', 'i', -1),)]
    """

    def __init__(self, extras: RequestExtras | None, block_size: int) -> None:
        self.extras = check_extras(extras)
        self.block_size = block_size
        self.next_block = 0
        self._cursor = 0
        self._lora = lora_keys(extras) if extras is not None else []
        embeds = extras.prompt_embeds if extras is not None else None
        self._embeds = np.ascontiguousarray(embeds) if isinstance(embeds, np.ndarray) else embeds

    @property
    def always_none(self) -> bool:
        """True when no block of the request can have extra keys."""
        return self.extras is None or self.extras.is_empty

    def next_blocks(self, num_blocks: int) -> list[tuple[ExtraKey, ...] | None]:
        """Keys of the next ``num_blocks`` full blocks (``None`` for a block without keys).

        Raises:
            ValueError: prompt embeddings given as a mapping that lacks a block's digest
                (the cursor then stays where it was).
        """
        first = self.next_block
        if self.always_none:
            keys: list[tuple[ExtraKey, ...] | None] = [None] * num_blocks
        else:
            cursor = self._cursor
            keys = []
            for start in range(first * self.block_size, (first + num_blocks) * self.block_size, self.block_size):
                block, cursor = self._block(start, start + self.block_size, cursor)
                keys.append(block)
            self._cursor = cursor
        self.next_block = first + num_blocks
        return keys

    def _block(self, start: int, end: int, cursor: int) -> tuple[tuple[ExtraKey, ...] | None, int]:
        extras = self.extras
        mm, cursor = mm_keys(extras.mm_items, start, end, cursor)
        keys = self._lora + mm
        if start == 0 and extras.cache_salt is not None:  # RequestExtras maps "" to None
            keys.append(("cache_salt", fresh_str(extras.cache_salt)))
        if self._embeds is not None:
            keys.append(("prompt_embeds", self._embeds_digest(start, end)))
        return (tuple(keys) if keys else None), cursor

    def _embeds_digest(self, start: int, end: int) -> bytes:
        """``_gen_prompt_embeds_extra_hash_keys``: sha256 of the raw bytes of rows
        ``[start, end)`` in C order (rows past the array's end are absent, as in a tensor
        slice). The digest depends on the array's dtype and byte order, not only on its
        values: it matches vLLM's only for the same raw bytes (for a bf16 tensor, pass its
        bits as an ``int16`` array, or the digests as a mapping)."""
        if isinstance(self._embeds, np.ndarray):
            return hashlib.sha256(self._embeds[start:end].tobytes()).digest()
        digest = self._embeds.get((start, end))
        if not isinstance(digest, bytes) or len(digest) != 32:
            raise ValueError(f"extras.prompt_embeds needs a 32-byte sha256 digest for block ({start}, {end}), "
                             f"got {digest!r}")
        return digest


def event_extra_keys_of(keys: tuple[ExtraKey, ...] | None) -> tuple[object, ...] | None:
    """One block's keys as vLLM publishes them in ``BlockStored.extra_keys`` (untagged).

    Models ``to_event_extra_keys`` (docs/specs/hashing.md §1.7): MM → ``(identifier,
    offset)``, LoRA → the bare name (path and kvlab's ``lora_identity`` are not
    published), cache salt → the bare string, prompt embeds → the bare digest.

    Example:
        >>> event_extra_keys_of((("lora", "ad", "/p"), ("mm", "img", 2), ("cache_salt", "s")))
        ('ad', ('img', 2), 's')
    """
    if keys is None:
        return None
    untagged: list[object] = []
    for key in keys:
        tag = key[0]
        if tag == "mm":
            untagged.append((key[1], key[2]))
        elif tag != "lora_identity":
            untagged.append(key[1])
    return tuple(untagged) if untagged else None
