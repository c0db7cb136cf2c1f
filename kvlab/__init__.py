"""kvlab — a Jupyter-first lab for KV-cache management in LLM serving.

The packages, their layer order and what each owns: ``docs/DESIGN.md`` (Layers).

``import kvlab`` imports nothing else (PEP 562): a name below, or a package
(``kvlab.sim``, ``kvlab.viz`` ...), is imported on first use, so the command line and a
notebook pay only for what they touch.

Example:
    >>> import kvlab
    >>> trace = kvlab.load_trace(kvlab.bundled_trace_path("conversation"))
    >>> result = kvlab.replay(trace, capacity_blocks=None)
    >>> round(result.summary.block_hit_ratio, 4)
    0.3664
"""

__version__ = "0.6.0"

#: Names of the front door -> the module each is taken from (on first use).
_EXPORTS = {
    "ReplayConfig": "kvlab.sim",
    "RunResult": "kvlab.core",
    "Trace": "kvlab.traces",
    "TraceFormatError": "kvlab.traces",
    "bundled_trace_path": "kvlab.paths",
    "data_dir": "kvlab.paths",
    "load_mooncake": "kvlab.traces",
    "load_trace": "kvlab.traces",
    "mrc": "kvlab.sim",
    "replay": "kvlab.sim",
    "simulate": "kvlab.sim.cluster",
    "sweep": "kvlab.sim",
}

__all__ = sorted(_EXPORTS)


def _submodules() -> set[str]:
    """The packages and modules of kvlab (``sim``, ``viz``, ``paths`` ...), read from its folder."""
    import pkgutil

    return {info.name for info in pkgutil.iter_modules(__path__)}


def __getattr__(name: str) -> object:
    """Import a front-door name or a subpackage on first use (PEP 562).

    Raises:
        AttributeError: ``name`` is neither.
    """
    import importlib

    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name in _submodules():
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS, *_submodules()})
