"""The part of a vLLM v1 request the KV cache manager reads: length, block hashes, progress.

Models ``vllm/v1/request.py :: Request`` (its cache-related fields; docs/specs/engines.md
§1, rules V8, V14). A request's full blocks are keyed by chained u64 block hashes, computed
as tokens arrive (:meth:`Request.from_tokens`, any :mod:`kvlab.hashing` profile) or given
directly (:meth:`Request.from_block_keys`, trace replay).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvlab.core.validate import check_count, check_positive
from kvlab.engines.vllm.block_pool import check_block_key
from kvlab.hashing.base import BlockHasher, RequestExtras, as_token_array


def _full_block_keys(hasher: BlockHasher, token_ids: list[int], extras: RequestExtras | None) -> list[int]:
    """The hasher's u64 keys of the full blocks (vLLM hashes no partial tail)."""
    keys = hasher.block_keys(token_ids, extras)
    return [int(k) for k in keys[: len(token_ids) // hasher.block_size]]


@dataclass(eq=False)
class Request:
    """What the KV cache manager needs to know about one request.

    Models the cache-related part of vLLM v1 ``Request``: its length, the chained
    block hashes of its full blocks (precomputed as tokens arrive, V8), how many tokens
    are computed, how often it was preempted. Build it with :meth:`from_tokens` (a
    :mod:`kvlab.hashing` profile hashes the tokens) or :meth:`from_block_keys` (trace
    replay: keys given directly).

    Example:
        >>> from kvlab.hashing import sim
        >>> req = Request.from_tokens("r0", range(10), sim(block_size=4))
        >>> req.num_tokens, len(req.block_hashes), req.block_size
        (10, 2, 4)
        >>> Request.from_block_keys("r1", 9, [7, 8])
        Request(request_id='r1', num_tokens=9, block_hashes=[7, 8], block_size=None, token_ids=None,
                num_computed_tokens=0, num_preemptions=0)
    """

    request_id: str
    """Unique id; the manager keys block tables by it (one live object per id)."""
    num_tokens: int
    """Tokens so far (prompt plus appended output), >= 1."""
    block_hashes: list[int]
    """u64 keys of the full blocks, chained (equal key ⇒ equal whole prefix)."""
    block_size: int | None = None
    """Block size the keys were computed for (the hasher's); ``None`` when given directly."""
    token_ids: list[int] | None = None
    """The tokens, when known (they go into ``BlockStored`` events)."""
    num_computed_tokens: int = 0
    """Tokens whose KV is in the request's blocks (hits included)."""
    num_preemptions: int = 0
    """Times the request was preempted (rule V14)."""
    hasher: BlockHasher | None = field(default=None, repr=False)
    """The profile that hashes appended tokens (:meth:`from_tokens` requests)."""
    extras: RequestExtras | None = field(default=None, repr=False)
    """LoRA / multimodal / salt inputs passed to ``hasher``."""

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id:
            raise ValueError(f"request_id must be a non-empty string, got {self.request_id!r}")
        check_positive("num_tokens", self.num_tokens)
        self.block_hashes = [check_block_key(f"block_hashes[{i}]", h) for i, h in enumerate(self.block_hashes)]
        if self.block_size is not None and len(self.block_hashes) != self.num_tokens // self.block_size:
            raise ValueError(f"block_hashes has {len(self.block_hashes)} keys but {self.num_tokens} tokens make "
                             f"{self.num_tokens // self.block_size} full blocks of {self.block_size}")
        if self.token_ids is not None and len(self.token_ids) != self.num_tokens:
            raise ValueError(f"token_ids has {len(self.token_ids)} tokens but num_tokens is {self.num_tokens}")
        if check_count("num_computed_tokens", self.num_computed_tokens) > self.num_tokens:
            raise ValueError(f"num_computed_tokens must be <= num_tokens ({self.num_tokens}), "
                             f"got {self.num_computed_tokens}")
        check_count("num_preemptions", self.num_preemptions)

    @classmethod
    def from_tokens(cls, request_id: str, token_ids: Sequence[int] | np.ndarray, hasher: BlockHasher,
                    extras: RequestExtras | None = None) -> Request:
        """A request whose full blocks are keyed by ``hasher.block_keys(token_ids, extras)``.

        The manager using it must have ``block_size == hasher.block_size``.

        Raises:
            ValueError: ``hasher`` is not a :class:`~kvlab.hashing.BlockHasher`; no
                tokens; invalid tokens or extras (from the hasher).
        """
        if not isinstance(hasher, BlockHasher):
            raise ValueError(f"hasher must be a kvlab.hashing BlockHasher, got {type(hasher).__name__}")
        tokens = [int(t) for t in as_token_array(token_ids)]
        return cls(request_id, len(tokens), _full_block_keys(hasher, tokens, extras), hasher.block_size, tokens,
                   hasher=hasher, extras=extras)

    @classmethod
    def from_block_keys(cls, request_id: str, num_tokens: int, block_keys: Iterable[int]) -> Request:
        """A request given its length and the u64 keys of its full blocks (trace replay).

        Pass one key per full block (``num_tokens // block_size`` keys; drop a trace's
        partial-tail key); the manager checks the count against its block size at use.
        No tokens are known, so the ``BlockStored`` events its blocks cause carry
        ``token_ids=()`` (the keys, parent key and block size only).

        Raises:
            ValueError: a bad id, length or key.
        """
        return cls(request_id, num_tokens, list(block_keys))

    def append_tokens(self, token_ids: Sequence[int] | np.ndarray) -> None:
        """Append output tokens (a :meth:`from_tokens` request); newly full blocks get keys.

        Raises:
            ValueError: the request was built from block keys, or no / invalid tokens.
        """
        if self.hasher is None or self.token_ids is None:
            raise ValueError(f"request {self.request_id!r} has no hasher (built from block keys); "
                             f"use append_block_keys")
        new = [int(t) for t in as_token_array(token_ids)]
        if not new:
            raise ValueError("token_ids must not be empty")
        tokens = self.token_ids + new
        if len(tokens) // self.hasher.block_size > len(self.block_hashes):
            self.block_hashes = _full_block_keys(self.hasher, tokens, self.extras)
        self.token_ids, self.num_tokens = tokens, len(tokens)

    def append_block_keys(self, num_new_tokens: int, block_keys: Iterable[int] = ()) -> None:
        """Append ``num_new_tokens`` tokens and the keys of the blocks they complete
        (a :meth:`from_block_keys` request).

        Raises:
            ValueError: the request has tokens (use :meth:`append_tokens`),
                ``num_new_tokens`` not an integer >= 1, or a bad key.
        """
        if self.token_ids is not None:
            raise ValueError(f"request {self.request_id!r} has token ids; use append_tokens")
        check_positive("num_new_tokens", num_new_tokens)
        keys = [check_block_key(f"block_keys[{i}]", k) for i, k in enumerate(block_keys)]
        self.num_tokens += num_new_tokens
        self.block_hashes.extend(keys)
