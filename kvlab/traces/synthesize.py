"""``synthesize_prefix``: a stated synthetic sharing model for traces that give token counts only
(Azure, Vidur), so that cache replays can run on their arrivals and lengths.

The model: there are ``num_prefixes`` shared prefixes (token sequences of at least
``shared_prefix_tokens`` tokens, distinct from their first token). Each request, independently,
picks prefix ``p`` with bounded Zipf probability ``∝ 1 / (p + 1) ** zipf_alpha`` (prefix 0 the
most popular) from a seeded ``numpy.random.default_rng(seed)``; its first
``min(shared_prefix_tokens, input_tokens)`` tokens are the first tokens of that prefix, the rest
are unique to the request. Block keys follow exactly: a block is shared when all its tokens lie
in the shared part (its key names the prefix, the block's position and its token count, so a
partial last block is shared only with requests of the same prefix and length); every other
block gets a key of its own. Keys are numbered ``0, 1, …`` in order of first appearance.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl

from kvlab.core.validate import check_flag, check_int, check_positive, check_real
from kvlab.traces.arrays import trace_from_arrays
from kvlab.traces.flat import intern_first_seen
from kvlab.traces.synthetic import zipf_cdf, zipf_ranks
from kvlab.traces.trace import Trace

#: What :func:`synthesize_prefix` adds to a trace's provenance notes (its parameters follow).
MODEL = ("synthetic sharing model (kvlab.traces.synthesize_prefix): each request's first "
         "min(shared_prefix_tokens, input_tokens) tokens are the start of one of num_prefixes shared prefixes, "
         "prefix p drawn with probability proportional to 1/(p+1)**zipf_alpha by numpy default_rng(seed); "
         "the rest of the prompt is unique; block keys are exact for this model, not measured")
_UNIQUE = np.uint64(1 << 63)


def synthesize_prefix(trace: Trace, *, shared_prefix_tokens: int = 512, num_prefixes: int = 100,
                      zipf_alpha: float = 1.0, seed: int = 0, block_size: int | None = None,
                      replace_keys: bool = False) -> Trace:
    """``trace``'s requests (arrivals, lengths, ids, other columns but ``token_ids``, which the
    model would contradict) with block keys from the synthetic sharing model of this module's
    docstring, and block identity.

    Args:
        trace: a trace without block identity (Azure, Vidur CSV), or any trace with ``replace_keys``.
        shared_prefix_tokens: tokens of a request's prompt taken from its shared prefix (≥ 1;
            shorter prompts are all prefix). The defaults (what ``--synthesize-prefix`` with no
            parameters runs: 512 tokens, 100 prefixes, Zipf 1.0, seed 0) are illustrative, fitted
            to no service; the source names the values that ran.
        num_prefixes: how many distinct shared prefixes (≥ 1).
        zipf_alpha: Zipf exponent of the prefixes' popularity (≥ 0; 0 = uniform).
        seed: the draws' seed (``numpy.random.default_rng(seed)``; an int ≥ 0).
        block_size: tokens per block of the new keys (``None``: the trace's).
        replace_keys: allow a trace with block identity, whose own keys are then replaced (a
            mistake unless meant: the real sharing is thrown away).

    Returns:
        A :class:`Trace` with ``block_identity=True``, ``partial_block_keyed=True``
        (``ceil(input_tokens / block_size)`` keys per request), a ``prefix_id`` column (u32, the
        prefix each request drew), ``source`` ending in ``synthesize_prefix(...)`` with every
        parameter (so every driver's summary shows them) and ``provenance`` with the model and
        its parameters under ``synthetic_prefix`` and a note.

    Raises:
        ValueError: a parameter out of range or of the wrong type (naming it), not a Trace, a trace
            with block identity without ``replace_keys=True``, or
            a model too large to key (``num_prefixes × blocks per prefix × (block_size + 1) ≥ 2**62``).

    Example:
        >>> t = Trace.from_arrays(list(range(7)), offsets=[0, 3, 6, 7], input_tokens=[40, 40, 10], block_size=16)
        >>> s = synthesize_prefix(t, shared_prefix_tokens=32, num_prefixes=1, replace_keys=True)
        >>> s.frame["block_keys"].to_list()  # blocks 0-1 shared; block 2 straddles: unique; 10 tokens: partial
        [[0, 1, 2], [0, 1, 3], [4]]
        >>> s.source
        'arrays + synthesize_prefix(shared_prefix_tokens=32, num_prefixes=1, zipf_alpha=1.0, seed=0, block_size=16)'
    """
    if not isinstance(trace, Trace):
        raise ValueError(f"trace must be a kvlab Trace, got {type(trace).__name__}")
    if trace.block_identity and not check_flag("replace_keys", replace_keys):
        raise ValueError(f"trace {trace.source!r} has block keys of its own (block identity): synthesize_prefix would "
                         "replace its real sharing with the model's; pass replace_keys=True to do that on purpose")
    shared = check_positive("shared_prefix_tokens", shared_prefix_tokens)
    num_prefixes = check_positive("num_prefixes", num_prefixes)
    zipf_alpha = float(check_real("zipf_alpha", zipf_alpha, low=0.0))
    seed = check_int("seed", seed, low=0)
    block_size = trace.block_size if block_size is None else check_positive("block_size", block_size)
    per_prefix = -(-shared // block_size)
    if num_prefixes * per_prefix * (block_size + 1) >= 2**62:
        raise ValueError(f"num_prefixes={num_prefixes} x {per_prefix} blocks per prefix is too large a model to key")
    inputs = trace.frame["input_tokens"].to_numpy().astype(np.int64)
    prefix = zipf_ranks(np.random.default_rng(seed), zipf_cdf(num_prefixes, zipf_alpha), inputs.shape[0])
    offsets, codes = _codes(inputs, prefix, shared, block_size, per_prefix)
    params = {"shared_prefix_tokens": shared, "num_prefixes": num_prefixes, "zipf_alpha": zipf_alpha, "seed": seed,
              "block_size": block_size}
    call = "synthesize_prefix(" + ", ".join(f"{k}={v!r}" for k, v in params.items()) + ")"
    frame = trace.frame
    out = trace_from_arrays(intern_first_seen(codes)[0].astype(np.uint64), offsets=offsets,
                            arrival_s=frame["arrival_s"].to_numpy(), input_tokens=inputs,
                            output_tokens=frame["output_tokens"].to_numpy(), request_id=frame["request_id"].to_numpy(),
                            block_size=block_size, source=f"{trace.source} + {call}")
    extra = [c for c in frame.columns if c not in out.frame.columns and c not in ("token_ids", "prefix_id")]
    notes = [*trace.provenance.get("notes", ()), f"{MODEL}: {call}"]
    if trace.block_identity:
        notes.append("the input trace's own block keys were replaced by the model's")
    provenance = {**trace.provenance, "notes": notes, "synthetic_prefix": {"model": MODEL, **params}}
    return replace(out, frame=out.frame.with_columns(*(frame[c] for c in extra),
                                                     pl.Series("prefix_id", prefix, dtype=pl.UInt32)),
                   provenance=provenance)


def _codes(inputs: np.ndarray, prefix: np.ndarray, shared: int, block_size: int,
           per_prefix: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR offsets (``int64[n + 1]``) and a ``uint64`` code per block: a shared block's
    ``(prefix, position, tokens)`` packed below 2**62, else ``2**63 + reference index``."""
    blocks = -(-inputs // block_size)
    offsets = np.zeros(blocks.shape[0] + 1, dtype=np.int64)
    np.cumsum(blocks, out=offsets[1:])
    request = np.repeat(np.arange(blocks.shape[0]), blocks)
    position = np.arange(offsets[-1], dtype=np.int64) - offsets[request]
    end = np.minimum((position + 1) * block_size, inputs[request])  # the block's last token + 1
    is_shared = end <= np.minimum(shared, inputs)[request]
    tokens = end - position * block_size
    codes = np.arange(offsets[-1], dtype=np.uint64) | _UNIQUE
    codes[is_shared] = ((prefix[request] * per_prefix + position) * (block_size + 1) + tokens)[is_shared].astype(
        np.uint64)
    return offsets, codes
