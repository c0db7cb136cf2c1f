"""Step-time models of the cluster simulation (docs/specs/cluster_sim.md §6.5; rules C10, C11, C12).

A worker runs one batch per step: prefill chunks ``(n_i new tokens after c_i context)`` and
decodes with contexts ``k_j`` (:class:`StepBatch`). A time model maps the batch to a
:class:`StepTime`: the step's seconds and its prefill share (C12: the prefill GPU seconds of
Mooncake FAST'25 Fig. 10 are the prefill parts of the steps). Every model is a small frozen
dataclass with one method, ``step_time(batch)``; an empty batch is no step and takes 0 s.

=========================  =======================================================================
model                      step time
=========================  =======================================================================
:class:`Roofline`          ``max(F/(G·mfu), bytes/(H·η))`` per phase + per-step, layer, request
                           overheads (BLIS roofline; C10; the default)
:class:`MooncakePrefill`   prefill ``(E1(len) − E1(prefix))/(G·mfu)`` (Mooncake Eq. 1; C11),
                           decode memory-bound ``(W + KV_dc)/(H·η)``
:class:`Linear`            ``β0 + β1·miss_tokens + β2·decodes`` (llm-d-inference-sim, BLIS blackbox)
:class:`ProfileTable`      interpolation in a user profile (Vidur, Dynamo NPZ) — in
                           :mod:`kvlab.sim.cluster.profile_table`
:class:`ZeroTime`          0 s (cache behaviour only; C23)
=========================  =======================================================================

What these numbers can claim is in docs/cluster_time_model.md (ratios and orderings; absolute
seconds only with a calibrated profile table).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

import numpy as np

from kvlab.core.validate import check_int, check_positive, check_real
from kvlab.tiers.cost import mooncake_prefill_flops
from kvlab.tiers.models import ModelSpec, get_gpu_flops, get_gpu_hbm_bytes_per_s, get_model

__all__ = ["Linear", "MooncakePrefill", "Roofline", "StepBatch", "StepTime", "ZeroTime"]


def _token_array(name: str, values: object, *, low: int) -> np.ndarray:
    """``values`` as a read-only 1-D int64 array of integers ``>= low``; ``ValueError`` naming ``name``."""
    arr = np.asarray(values)
    if arr.size == 0:
        arr = np.zeros(0, dtype=np.int64)
    if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0) or np.issubdtype(arr.dtype, bool):
        raise ValueError(f"{name} must be a 1-D sequence of integers, got {values!r}")
    arr = arr.astype(np.int64)
    if arr.size and arr.min() < low:
        raise ValueError(f"{name} must hold integers >= {low}, got {int(arr.min())}")
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, eq=False)
class StepBatch:
    """What one engine step computes: prefill chunks and decodes (cluster_sim.md §6.5 notation).

    Args:
        prefill: ``(n_i, c_i)`` pairs — ``n_i >= 1`` new tokens computed after ``c_i >= 0``
            tokens of context (cached prefix plus earlier chunks); a sequence of pairs or an
            ``(m, 2)`` integer array.
        decode: contexts ``k_j >= 1`` of the decoding requests (tokens before the new one).

    Attributes ``prefill_new_tokens``, ``prefill_context_tokens`` (shape ``(m,)``) and
    ``decode_context_tokens`` (shape ``(d,)``) are read-only int64 arrays. Raises ``ValueError``
    naming the field and the value on bad input.

    >>> b = StepBatch(prefill=[(1000, 0), (512, 1024)], decode=[2000, 3000])
    >>> b.num_prefill, b.num_decode, b.num_requests, b.miss_tokens
    (2, 2, 4, 1512)
    """

    prefill: object = ()
    decode: object = ()
    prefill_new_tokens: np.ndarray = field(init=False, repr=False)
    prefill_context_tokens: np.ndarray = field(init=False, repr=False)
    decode_context_tokens: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        pairs = np.asarray(self.prefill)
        if pairs.size == 0:
            pairs = np.zeros((0, 2), dtype=np.int64)
        if pairs.ndim != 2 or pairs.shape[1] != 2:
            raise ValueError(f"prefill must be (new_tokens, context_tokens) pairs, got {self.prefill!r}")
        object.__setattr__(self, "prefill_new_tokens", _token_array("prefill new_tokens", pairs[:, 0], low=1))
        object.__setattr__(self, "prefill_context_tokens",
                           _token_array("prefill context_tokens", pairs[:, 1], low=0))
        object.__setattr__(self, "decode_context_tokens", _token_array("decode", self.decode, low=1))

    @property
    def num_prefill(self) -> int:
        """Prefill chunks in the step."""
        return int(self.prefill_new_tokens.size)

    @property
    def num_decode(self) -> int:
        """Decoding requests in the step."""
        return int(self.decode_context_tokens.size)

    @property
    def num_requests(self) -> int:
        """Requests in the step (prefill chunks + decodes)."""
        return self.num_prefill + self.num_decode

    @property
    def miss_tokens(self) -> int:
        """New prompt tokens computed in the step, ``Σ n_i`` (the prefix-cache misses)."""
        return int(self.prefill_new_tokens.sum())


class StepTime(NamedTuple):
    """A step's duration and its prefill share, seconds (``0 <= prefill_s <= step_s``; C12)."""

    step_s: float
    prefill_s: float


def _check_batch(batch: object) -> StepBatch:
    if not isinstance(batch, StepBatch):
        raise ValueError(f"batch must be a StepBatch, got {batch!r}")
    return batch


def _resolve_model(model: object) -> ModelSpec:
    """A :class:`ModelSpec`, or the preset named ``model``; ``ValueError`` otherwise."""
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, str):
        return get_model(model)
    raise ValueError(f"model must be a ModelSpec or a model name, got {model!r}")


def _resolve_gpu(gpu: object) -> tuple[float, float]:
    """``(FLOP/s, HBM bytes/s)`` of one GPU from a preset name or a ``(flops, bytes_per_s)`` pair."""
    if isinstance(gpu, str):
        return get_gpu_flops(gpu), get_gpu_hbm_bytes_per_s(gpu)
    if isinstance(gpu, (tuple, list)) and len(gpu) == 2:
        return (check_real("gpu flops", gpu[0], low=0.0, low_open=True),
                check_real("gpu hbm_bytes_per_s", gpu[1], low=0.0, low_open=True))
    raise ValueError(f"gpu must be a GPU name or a (flops, hbm_bytes_per_s) pair, got {gpu!r}")


def _check_fraction(name: str, value: object) -> float:
    return check_real(name, value, low=0.0, high=1.0, low_open=True)


def _fixed_share(fixed_s: float, batch: StepBatch) -> float:
    """The prefill part of a per-step cost: split by request count (C12, our definition)."""
    return fixed_s * batch.num_prefill / batch.num_requests


@dataclass(frozen=True, eq=False)
class _Hardware:
    """Model, GPU and tensor parallelism shared by the analytic models (resolved on construction)."""

    model: ModelSpec | str = "Llama-3.1-8B"
    gpu: str | tuple[float, float] = "H100-SXM"
    tp: int = 1
    bytes_per_elem: int | None = None
    peak_flops: float = field(init=False)
    hbm_bytes_per_s: float = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "model", _resolve_model(self.model))
        flops, hbm = _resolve_gpu(self.gpu)
        tp = check_positive("tp", self.tp)
        object.__setattr__(self, "peak_flops", flops * tp)
        object.__setattr__(self, "hbm_bytes_per_s", hbm * tp)
        check_int("bytes_per_elem", self.bytes_per_elem, low=1, optional=True)

    @property
    def weight_bytes(self) -> float:
        """``W = num_active_params × bytes_per_elem``: weights read once per step (None → the model's)."""
        per_elem = self.model.bytes_per_elem if self.bytes_per_elem is None else self.bytes_per_elem
        return self.model.num_active_params * per_elem

    def _flops(self, new_tokens: np.ndarray, context_tokens: np.ndarray) -> float:
        """``Σ m.prefill_flops(n_i, c_i)``."""
        return float(sum(self.model.prefill_flops(int(n), int(c)) for n, c in zip(new_tokens, context_tokens)))

    @cached_property
    def _decode_flop_terms(self) -> tuple[float, float]:
        """``m.prefill_flops(1, k) = a + b·k``: ``(a, b)``."""
        base = self.model.prefill_flops(1, 0)
        return base, self.model.prefill_flops(1, 1) - base

    def _decode_flops(self, num_decode: int, context_tokens: int) -> float:
        """``Σ_j m.prefill_flops(1, k_j)`` from ``num_decode`` and ``Σ k_j`` (linear in ``k``)."""
        base, per_token = self._decode_flop_terms
        return num_decode * base + per_token * context_tokens

    def _decode_bytes(self, batch: StepBatch) -> float:
        """``KV_dc = Σ_j (k_j + 1) × kv_bytes_per_token``."""
        return float((batch.decode_context_tokens + 1).sum()) * self.model.kv_bytes_per_token


@dataclass(frozen=True, eq=False)
class Roofline(_Hardware):
    """Roofline step time per phase, BLIS form (cluster_sim.md §6.5; rule C10) — the default model.

    ``T = max(F_pf/(G·mfu_pf), (W·[no decode] + KV_pf)/(H·η)) + max(F_dc/(G·mfu_dc), (W + KV_dc)/(H·η))
    + t_step_s + t_layer_s·L + t_req_s·#requests`` with ``G``, ``H`` the GPU's FLOP/s and HBM
    bytes/s times ``tp``, ``F_pf = Σ m.prefill_flops(n_i, c_i)``, ``F_dc = Σ m.prefill_flops(1, k_j)``,
    ``KV_pf = Σ (c_i + n_i)·kv_bytes_per_token``, ``KV_dc = Σ (k_j + 1)·kv_bytes_per_token``,
    ``W = num_active_params × bytes_per_elem`` charged once (to decode if any decode runs, else to
    prefill), ``L`` the model's layers. A phase without requests costs nothing.

    The prefill share (C12) is the prefill phase term plus the prefill requests' ``t_req_s`` and
    their request-count share of ``t_step_s + t_layer_s·L``.

    Args:
        model: a :class:`~kvlab.tiers.models.ModelSpec` or a preset name.
        gpu: a :data:`~kvlab.tiers.models.GPU_FLOPS` name, or ``(flop_per_s, hbm_bytes_per_s)`` of one GPU.
        tp: tensor-parallel degree (multiplies ``G`` and ``H``).
        bytes_per_elem: bytes per weight (``None`` → the model's); KV bytes come from the model.
        mfu_pf, mfu_dc, eta: in ``(0, 1]`` (defaults 0.45, 0.30, 1.0: BLIS hardware_config.json).
        t_step_s, t_layer_s, t_req_s: ``>= 0`` (0.13 ms, 32 µs per layer, 4 µs per request).

    Raises ``ValueError`` naming the field and the value (unknown model or GPU, mfu out of range…).

    >>> r = Roofline(model="Llama-3.1-8B", gpu="H100-SXM")
    >>> t = r.step_time(StepBatch(decode=[2000] * 8))       # memory-bound decode: no prefill share
    >>> round(t.step_s * 1e3, 3), t.prefill_s
    (6.606, 0.0)
    """

    mfu_pf: float = 0.45
    mfu_dc: float = 0.30
    eta: float = 1.0
    t_step_s: float = 0.13e-3
    t_layer_s: float = 32e-6
    t_req_s: float = 4e-6

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("mfu_pf", "mfu_dc", "eta"):
            _check_fraction(name, getattr(self, name))
        for name in ("t_step_s", "t_layer_s", "t_req_s"):
            check_real(name, getattr(self, name), low=0.0)

    def step_time(self, batch: StepBatch) -> StepTime:
        """The step's seconds and prefill share for ``batch`` (a :class:`StepBatch`)."""
        batch = _check_batch(batch)
        if batch.num_requests == 0:
            return StepTime(0.0, 0.0)
        g, h = self.peak_flops, self.hbm_bytes_per_s * self.eta
        w = self.weight_bytes
        prefill = decode = 0.0
        if batch.num_prefill:
            f_pf = self._flops(batch.prefill_new_tokens, batch.prefill_context_tokens)
            kv_tokens = batch.prefill_context_tokens + batch.prefill_new_tokens
            kv_pf = float(kv_tokens.sum()) * self.model.kv_bytes_per_token
            prefill = max(f_pf / (g * self.mfu_pf), ((0.0 if batch.num_decode else w) + kv_pf) / h)
        if batch.num_decode:
            f_dc = self._flops(np.ones_like(batch.decode_context_tokens), batch.decode_context_tokens)
            decode = max(f_dc / (g * self.mfu_dc), (w + self._decode_bytes(batch)) / h)
        fixed = self.t_step_s + self.t_layer_s * self.model.layers
        step = prefill + decode + fixed + self.t_req_s * batch.num_requests
        share = prefill + self.t_req_s * batch.num_prefill + _fixed_share(fixed, batch)
        return StepTime(step, min(share, step))

    @cached_property
    def _decode_constants(self) -> tuple[float, ...]:
        base, per_token = self._decode_flop_terms
        return (base, per_token, self.peak_flops * self.mfu_dc, self.weight_bytes, float(self.model.kv_bytes_per_token),
                self.hbm_bytes_per_s * self.eta, self.t_step_s + self.t_layer_s * self.model.layers, self.t_req_s)

    def decode_step_times(self, num_decode: int, context_tokens: np.ndarray) -> np.ndarray:
        """Seconds of decode-only steps of ``num_decode`` requests whose contexts sum to each of
        ``context_tokens`` (int64 array): :meth:`step_time`'s closed form (C9); no prefill share."""
        base, per_token, g, w, kvb, h, fixed, t_req = self._decode_constants
        ctx = np.asarray(context_tokens, dtype=np.float64)
        decode = np.maximum((num_decode * base + per_token * ctx) / g, (w + (ctx + num_decode) * kvb) / h)
        return decode + fixed + t_req * num_decode


@dataclass(frozen=True, eq=False)
class MooncakePrefill(_Hardware):
    """Mooncake FAST'25 prefill time (Eq. 1; rule C11) with a memory-bound decode (cluster_sim.md §6.5).

    Each prefill chunk ``(n_i, c_i)`` takes ``(E1(c_i + n_i) − E1(c_i)) / (G·mfu)`` with
    ``E1(x) = l·(a·x²·d + b·x·d²)`` (:func:`~kvlab.tiers.cost.mooncake_prefill_flops`, ``a = 4``,
    ``b = 22``); the decodes take ``(W + KV_dc)/(H·η)`` together. No fixed overheads. The prefill
    share is the sum of the chunks' times.

    Args: ``model``, ``gpu``, ``tp``, ``bytes_per_elem`` as :class:`Roofline`; ``mfu`` and ``eta``
    in ``(0, 1]`` (0.45 like the roofline's prefill, 1.0); ``a``, ``b`` > 0. ``ValueError`` on bad input.

    >>> m = MooncakePrefill(model="Llama-3-70B", gpu="A800", tp=8)
    >>> t = m.step_time(StepBatch(prefill=[(1000, 0)]))    # 80·(4·1e6·8192 + 22·1e3·8192²) / (8·312e12·0.45)
    >>> round(t.step_s, 4), t.step_s == t.prefill_s
    (0.1075, True)
    """

    mfu: float = 0.45
    eta: float = 1.0
    a: float = 4.0
    b: float = 22.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_fraction("mfu", self.mfu)
        _check_fraction("eta", self.eta)
        check_real("a", self.a, low=0.0, low_open=True)
        check_real("b", self.b, low=0.0, low_open=True)

    def step_time(self, batch: StepBatch) -> StepTime:
        """The step's seconds and prefill share for ``batch`` (a :class:`StepBatch`)."""
        batch = _check_batch(batch)

        def e1(x: int) -> float:
            return mooncake_prefill_flops(int(x), self.model, a=self.a, b=self.b)

        flops = sum(e1(c + n) - e1(c) for n, c in zip(batch.prefill_new_tokens, batch.prefill_context_tokens))
        prefill = flops / (self.peak_flops * self.mfu)
        decode = 0.0
        if batch.num_decode:
            decode = (self.weight_bytes + self._decode_bytes(batch)) / (self.hbm_bytes_per_s * self.eta)
        return StepTime(prefill + decode, prefill)

    def decode_step_times(self, num_decode: int, context_tokens: np.ndarray) -> np.ndarray:
        """Seconds of decode-only steps of ``num_decode`` requests whose contexts sum to each of
        ``context_tokens``: :meth:`step_time`'s closed form (C9)."""
        kv = (np.asarray(context_tokens, dtype=np.float64) + num_decode) * float(self.model.kv_bytes_per_token)
        return (self.weight_bytes + kv) / (self.hbm_bytes_per_s * self.eta)


@dataclass(frozen=True)
class Linear:
    """Step time linear in the batch: ``β0 + β1·miss_tokens + β2·decodes`` (cluster_sim.md §6.5).

    The form of llm-d-inference-sim's per-token latency and BLIS's removed blackbox model:
    ``miss_tokens = Σ n_i``. The prefill share is ``β1·miss_tokens`` plus the prefill chunks'
    request-count share of ``β0``. Coefficients are seconds, each ``>= 0``; ``ValueError`` otherwise.

    >>> Linear(beta0=1e-3, beta1=1e-5, beta2=1e-4).step_time(StepBatch(prefill=[(100, 0)], decode=[50]))
    ... # β0 + β1·100 + β2·1; prefill: β1·100 + β0/2
    StepTime(step_s=0.0021, prefill_s=0.0015)
    """

    beta0: float = 0.0
    beta1: float = 0.0
    beta2: float = 0.0

    def __post_init__(self) -> None:
        for name in ("beta0", "beta1", "beta2"):
            check_real(name, getattr(self, name), low=0.0)

    def step_time(self, batch: StepBatch) -> StepTime:
        """The step's seconds and prefill share for ``batch`` (a :class:`StepBatch`)."""
        batch = _check_batch(batch)
        if batch.num_requests == 0:
            return StepTime(0.0, 0.0)
        prefill = self.beta1 * batch.miss_tokens
        step = self.beta0 + prefill + self.beta2 * batch.num_decode
        return StepTime(step, min(prefill + _fixed_share(self.beta0, batch), step))

    def decode_step_times(self, num_decode: int, context_tokens: np.ndarray) -> np.ndarray:
        """Seconds of decode-only steps of ``num_decode`` requests, one per entry of ``context_tokens`` (C9)."""
        return np.full(np.shape(context_tokens), self.beta0 + self.beta2 * num_decode, dtype=np.float64)


@dataclass(frozen=True)
class ZeroTime:
    """Every step takes 0 s: only cache behaviour remains (rule C23: hit counts equal ``route_requests``).

    >>> ZeroTime().step_time(StepBatch(prefill=[(4096, 0)], decode=[10] * 64))
    StepTime(step_s=0.0, prefill_s=0.0)
    """

    def step_time(self, batch: StepBatch) -> StepTime:
        """``StepTime(0.0, 0.0)`` for any :class:`StepBatch`."""
        _check_batch(batch)
        return StepTime(0.0, 0.0)

    def decode_step_times(self, num_decode: int, context_tokens: np.ndarray) -> np.ndarray:  # noqa: ARG002
        """Zeros, one per entry of ``context_tokens`` (C9's closed form of decode-only steps)."""
        return np.zeros(np.shape(context_tokens), dtype=np.float64)

