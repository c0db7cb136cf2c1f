"""A trace's prompts as engine blocks: chained engine keys, their tokens, their llm-d request keys.

A trace names each prompt by chained block keys of its own block size (Mooncake: 512 tokens);
a simulated worker caches engine blocks of ``block_size`` tokens (vLLM: 16). Engine block ``b``
covers tokens ``[b·block_size, (b+1)·block_size)``; its key mixes (splitmix64) the trace key of
the trace block holding its last token with that token's offset in the trace block. Equal trace
keys mean equal prefixes through the whole trace block, so equal engine keys mean equal
prefixes: the chaining survives, and prompts keep their real length.

An engine block's tokens are a function of its key (``block_size`` splitmix64 draws), so KV
events can carry tokens for the index (llm-d recomputes request keys from tokens, rule L18)
without storing prompts, and a request key is memoised per engine key.
"""

from __future__ import annotations

import numpy as np

from kvlab.core.validate import check_positive
from kvlab.hashing.llmd_hash import LlmdHasher
from kvlab.traces import Trace

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
#: Salt of output-token block keys (never a prompt key: those mix a trace key with an offset).
_OUTPUT_SALT = np.uint64(0xD1B54A32D192ED03)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser of ``x + golden`` over a uint64 array (wrapping arithmetic).

    >>> int(splitmix64(np.array([0], dtype=np.uint64))[0]) == 0xE220A8397B1DCDAF
    True
    """
    with np.errstate(over="ignore"):
        z = np.asarray(x, dtype=np.uint64) + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def engine_block_keys(trace_keys: np.ndarray, input_tokens: int, trace_block_size: int,
                      block_size: int) -> np.ndarray:
    """The chained engine keys (uint64, one per full engine block) of one trace prompt.

    Args:
        trace_keys: the prompt's trace block keys (uint64, chained), covering ``input_tokens``.
        input_tokens: the prompt length, tokens.
        trace_block_size, block_size: tokens per trace block and per engine block.

    Raises:
        ValueError: the trace keys cover fewer than ``input_tokens`` tokens' full engine blocks.

    >>> keys = engine_block_keys(np.array([7, 8], dtype=np.uint64), 1000, 512, 16)
    >>> keys.shape, bool(keys[0] != keys[1])
    ((62,), True)
    """
    num_blocks = input_tokens // block_size
    ends = (np.arange(1, num_blocks + 1, dtype=np.int64) * block_size) - 1
    which = ends // trace_block_size
    if num_blocks and which[-1] >= len(trace_keys):
        raise ValueError(f"{len(trace_keys)} trace block keys of {trace_block_size} tokens do not cover a "
                         f"{input_tokens}-token prompt")
    offsets = (ends % trace_block_size).astype(np.uint64)
    keys = np.asarray(trace_keys, dtype=np.uint64)[which]
    with np.errstate(over="ignore"):
        out = splitmix64(splitmix64(keys) ^ offsets)
    out[out == 0] = 1  # 0 is no key (vLLM's None parent)
    return out


def output_block_key(request_index: int, block_index: int) -> int:
    """The engine key of a request's ``block_index``-th block when its tokens are unique to the
    request: output tokens, or the prompt's trailing tokens a trace keys no block for (traces of
    full blocks only, e.g. kv-cache-tester).

    The trace gives such tokens no identity, so the key mixes the request's index, the block's
    position and a salt: never a key of a keyed prompt block, never another request's.

    >>> output_block_key(0, 3) != output_block_key(1, 3)
    True
    """
    mask = (1 << 64) - 1
    x = ((request_index * int(_M1)) & mask) ^ block_index ^ int(_OUTPUT_SALT)
    for _ in range(2):  # splitmix64 twice, on Python ints (a scalar: faster than numpy)
        z = (x + int(_GOLDEN)) & mask
        z = ((z ^ (z >> 30)) * int(_M1)) & mask
        z = ((z ^ (z >> 27)) * int(_M2)) & mask
        x = z ^ (z >> 31)
    return x or 1


def block_tokens(keys: list[int] | np.ndarray, block_size: int) -> np.ndarray:
    """``block_size`` token ids (uint32, < 2**31) per engine key, drawn by splitmix64: shape
    ``(len(keys), block_size)``; a key always gives the same tokens.

    >>> t = block_tokens([5, 6], 4)
    >>> t.shape, t[0].tolist() == block_tokens([5], 4)[0].tolist(), bool((t[0] != t[1]).any())
    ((2, 4), True, True)
    """
    with np.errstate(over="ignore"):
        seq = (np.asarray(keys, dtype=np.uint64)[:, None]
               + np.arange(1, block_size + 1, dtype=np.uint64)[None, :] * _GOLDEN)
    return (splitmix64(seq) & np.uint64(0x7FFFFFFF)).astype(np.uint32)


class PromptSource:
    """Engine keys per request of a trace, and llm-d request keys memoised per engine key.

    Args:
        trace: the trace (chained block keys).
        block_size: the engine block size, tokens (>= 1).

    Raises:
        ValueError: not a Trace, a bad block size.

    Example:
        >>> from kvlab.traces import load_trace
        >>> src = PromptSource(load_trace("conversation").head(3), 16)
        >>> [len(src.engine_keys(i)) for i in range(3)]
        [422, 457, 452]
    """

    def __init__(self, trace: Trace, block_size: int) -> None:
        if not isinstance(trace, Trace):
            raise ValueError(f"trace must be a kvlab Trace, got {type(trace).__name__}")
        self.block_size = check_positive("block_size", block_size)
        self.trace_block_size = trace.block_size
        self._keys = trace.frame["block_keys"].to_list()
        self._inputs = trace.frame["input_tokens"].to_list()
        self._request_keys: dict[int, int] = {}
        self._partial_keyed = trace.partial_block_keyed
        self._tokens = trace.frame["token_ids"] if "token_ids" in trace.frame.columns else None

    def engine_keys(self, i: int) -> list[int]:
        """The engine keys (ints) of request ``i``'s full prompt blocks. Where the trace keys full
        blocks only, the engine blocks past its last keyed token are unique to the request
        (:func:`output_block_key`)."""
        keys = np.asarray(self._keys[i], dtype=np.uint64)
        tokens = self._inputs[i]
        if self._partial_keyed:
            return engine_block_keys(keys, tokens, self.trace_block_size, self.block_size).tolist()
        covered = min(tokens, len(keys) * self.trace_block_size)
        shared = engine_block_keys(keys, covered, self.trace_block_size, self.block_size).tolist()
        return shared + [output_block_key(i, b) for b in range(len(shared), tokens // self.block_size)]

    def token_ids(self, i: int) -> np.ndarray:
        """Request ``i``'s prompt tokens (uint32), from the trace's ``token_ids``.

        Raises:
            ValueError: the trace has no ``token_ids`` column.
        """
        if self._tokens is None:
            raise ValueError("the trace has no token_ids column; CacheBlend (blend=) matches prompt tokens")
        return self._tokens[i].to_numpy().astype(np.uint32)

    def event_tokens(self, engine_keys: list[int]) -> np.ndarray:
        """The tokens (uint32) of the blocks with ``engine_keys`` (what a ``BlockStored`` carries)."""
        return block_tokens(engine_keys, self.block_size).ravel()

    def request_keys(self, engine_keys: list[int], hasher: LlmdHasher, root: int) -> list[int]:
        """llm-d's request keys of a prompt's blocks (rule L18: the chain from ``root`` over the
        tokens), memoised per engine key (a block's tokens are a function of its key)."""
        memo = self._request_keys
        known = 0
        while known < len(engine_keys) and engine_keys[known] in memo:
            known += 1
        out = [memo[k] for k in engine_keys[:known]]
        if known < len(engine_keys):  # the rest in one chain from the last known key
            rest = engine_keys[known:]
            tokens = block_tokens(rest, self.block_size).ravel()
            keys = hasher.block_hashes(tokens, parent_key=out[-1] if out else root)
            memo.update(zip(rest, keys))
            out.extend(keys)
        return out
