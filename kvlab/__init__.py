"""kvlab — a Jupyter-first lab for KV-cache management in LLM serving.

Layers (one concern per package; a layer imports only layers above it, and only
``viz``, ``ui`` and ``cli`` import altair or ipywidgets):

=================  =====================================================================
package            owns
=================  =====================================================================
``kvlab.hashing``  tokens → chained block keys, one profile per engine
``kvlab.traces``   real and synthetic workloads as a :class:`~kvlab.traces.Trace`
``kvlab.policies`` eviction policies as small plug-ins (reference class + numba hooks)
``kvlab.events``   KV events and vLLM's ZMQ wire codec
``kvlab.sim``      cache-level replay (numba kernels), capacity sweeps
``kvlab.viz``      altair chart builders: polars frame in, chart out
``kvlab.ui``       ipywidgets panels composing ``sim`` and ``viz``
``kvlab.cli``      the ``kvlab`` command
=================  =====================================================================

Example:
    >>> import kvlab
    >>> trace = kvlab.load_trace(kvlab.bundled_trace_path("conversation"))
    >>> result = kvlab.replay(trace, capacity_blocks=None)
    >>> round(result.summary.block_hit_ratio, 4)
    0.3664
"""

__version__ = "0.6.0"

from kvlab.paths import bundled_trace_path, data_dir  # noqa: E402 - __version__ first, for kvlab.cli
from kvlab.core import RunResult  # noqa: E402
from kvlab.sim import ReplayConfig, mrc, replay, sweep  # noqa: E402
from kvlab.traces import Trace, TraceFormatError, load_mooncake, load_trace  # noqa: E402

__all__ = [
    "ReplayConfig",
    "RunResult",
    "Trace",
    "TraceFormatError",
    "bundled_trace_path",
    "data_dir",
    "load_mooncake",
    "load_trace",
    "mrc",
    "replay",
    "sweep",
]
