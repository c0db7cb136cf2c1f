"""Step time from a user's measured profile (cluster_sim.md §6.5 "Table mode"; Vidur, Dynamo mocker NPZ).

Prefill time is interpolated linearly over the batch's new tokens; decode time bilinearly over
``(Σ context, mean context)`` of the decoding requests. The table is the only way the simulation's
seconds mean seconds on a real GPU (docs/cluster_time_model.md): bring one measured on the
engine, model and GPU you simulate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvlab.sim.cluster.timing import StepBatch, StepTime, _check_batch

__all__ = ["ProfileTable"]


def _axis(name: str, values: object) -> np.ndarray:
    """A read-only float64 grid axis: 1-D, >= 2 finite values >= 0, strictly increasing."""
    arr = np.asarray(values)
    if (arr.ndim != 1 or arr.size < 2 or not np.issubdtype(arr.dtype, np.number)
            or np.issubdtype(arr.dtype, bool)):
        raise ValueError(f"{name} must be a 1-D array of at least 2 numbers, got {values!r}")
    arr = arr.astype(np.float64)
    if not np.all(np.isfinite(arr)) or arr[0] < 0 or np.any(np.diff(arr) <= 0):
        raise ValueError(f"{name} must be finite, >= 0 and strictly increasing, got {values!r}")
    arr.setflags(write=False)
    return arr


def _seconds(name: str, values: object, shape: tuple[int, ...]) -> np.ndarray:
    """A read-only float64 array of finite seconds >= 0 with ``shape``."""
    arr = np.asarray(values)
    if arr.shape != shape or not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, bool):
        raise ValueError(f"{name} must be a numeric array of shape {shape}, got {values!r}")
    arr = arr.astype(np.float64)
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{name} must hold finite seconds >= 0, got {values!r}")
    arr.setflags(write=False)
    return arr


def _locate(name: str, axis: np.ndarray, x: float) -> tuple[int, float]:
    """Segment index ``i`` and weight ``u`` with ``x = (1 − u)·axis[i] + u·axis[i+1]``; outside → ValueError."""
    if not axis[0] <= x <= axis[-1]:
        raise ValueError(f"{name} {x:g} is outside the profile's range [{axis[0]:g}, {axis[-1]:g}]")
    i = min(int(np.searchsorted(axis, x, side="right")) - 1, axis.size - 2)
    return i, (x - axis[i]) / (axis[i + 1] - axis[i])


@dataclass(frozen=True, eq=False)
class ProfileTable:
    """Interpolated step time from measured profiles (cluster_sim.md §6.5 Table mode).

    ``T = prefill(Σ n_i) + decode(Σ k_j, mean k_j)``: ``prefill`` is :func:`numpy.interp` over
    ``prefill_tokens`` → ``prefill_s``; ``decode`` is bilinear over the grid
    ``decode_total_context`` × ``decode_mean_context`` → ``decode_s[i, j]``. A phase without
    requests costs nothing; the prefill share (C12) is the prefill term. Values at grid points are
    returned exactly.

    Args:
        prefill_tokens: shape ``(p,)``, batch new tokens, strictly increasing, ``>= 0``, ``p >= 2``.
        prefill_s: shape ``(p,)``, measured prefill seconds ``>= 0``.
        decode_total_context: shape ``(t,)``, ``Σ k_j`` grid, strictly increasing, ``t >= 2``.
        decode_mean_context: shape ``(u,)``, mean ``k_j`` grid, strictly increasing, ``u >= 2``.
        decode_s: shape ``(t, u)``, measured decode-step seconds ``>= 0``.

    Raises ``ValueError`` naming the field on a malformed table, and from :meth:`step_time` when
    the batch falls outside the table (no extrapolation: a profile claims nothing beyond its range).

    >>> table = ProfileTable(prefill_tokens=[0, 1024, 2048], prefill_s=[0.0, 0.05, 0.12],
    ...                      decode_total_context=[0, 65536], decode_mean_context=[0, 4096],
    ...                      decode_s=[[0.005, 0.006], [0.009, 0.010]])
    >>> t = table.step_time(StepBatch(prefill=[(1536, 0)], decode=[2048] * 16))  # 0.085 + 0.0075
    >>> round(t.step_s, 6), round(t.prefill_s, 6)
    (0.0925, 0.085)
    """

    prefill_tokens: np.ndarray
    prefill_s: np.ndarray
    decode_total_context: np.ndarray
    decode_mean_context: np.ndarray
    decode_s: np.ndarray

    def __post_init__(self) -> None:
        tokens = _axis("prefill_tokens", self.prefill_tokens)
        total = _axis("decode_total_context", self.decode_total_context)
        mean = _axis("decode_mean_context", self.decode_mean_context)
        object.__setattr__(self, "prefill_tokens", tokens)
        object.__setattr__(self, "prefill_s", _seconds("prefill_s", self.prefill_s, tokens.shape))
        object.__setattr__(self, "decode_total_context", total)
        object.__setattr__(self, "decode_mean_context", mean)
        object.__setattr__(self, "decode_s", _seconds("decode_s", self.decode_s, (total.size, mean.size)))

    def prefill_time_s(self, new_tokens: int) -> float:
        """Interpolated prefill seconds of a batch with ``new_tokens`` new tokens (0 → 0 s)."""
        if new_tokens == 0:
            return 0.0
        _locate("batch new tokens", self.prefill_tokens, float(new_tokens))
        return float(np.interp(float(new_tokens), self.prefill_tokens, self.prefill_s))

    def decode_time_s(self, total_context: float, mean_context: float) -> float:
        """Bilinearly interpolated decode-step seconds at ``(Σ context, mean context)``."""
        i, u = _locate("decode total context", self.decode_total_context, float(total_context))
        j, v = _locate("decode mean context", self.decode_mean_context, float(mean_context))
        s = self.decode_s
        low = (1 - v) * s[i, j] + v * s[i, j + 1]
        high = (1 - v) * s[i + 1, j] + v * s[i + 1, j + 1]
        return float((1 - u) * low + u * high)

    def step_time(self, batch: StepBatch) -> StepTime:
        """The step's seconds and prefill share for ``batch`` (a :class:`StepBatch`)."""
        batch = _check_batch(batch)
        prefill = self.prefill_time_s(batch.miss_tokens)
        decode = 0.0
        if batch.num_decode:
            total = float(batch.decode_context_tokens.sum())
            decode = self.decode_time_s(total, total / batch.num_decode)
        return StepTime(prefill + decode, prefill)

    def decode_step_times(self, num_decode: int, context_tokens: np.ndarray) -> np.ndarray:
        """Seconds of decode-only steps of ``num_decode`` requests whose contexts sum to each of
        ``context_tokens`` (C9)."""
        return np.array([self.decode_time_s(float(c), float(c) / num_decode) for c in np.asarray(context_tokens)],
                        dtype=np.float64)
