"""The lowest layer: what every other kvlab package shares.

=============================  ===============================================================
name                           what
=============================  ===============================================================
:class:`RunResult`             the result every driver returns: ``requests``, ``timeline``,
                               ``summary``, ``config``
:class:`RunSummary`            base of every driver's frozen summary (``to_dict()``)
:func:`check_result`           the result contract (core columns, timeline schema, summary echo)
:func:`timeline_frame`         the long ``step, time_s, tier, metric, value`` frame
:func:`timeline_steps`         a bounded timeline's steps (buckets); :func:`bucket_sums` its counters
:mod:`kvlab.core.semantics`    replay semantics vocabulary (touch orders, hit semantics)
=============================  ===============================================================

The layer order of the whole package is in ``docs/DESIGN.md``.
"""

#: Names of ``kvlab.core`` -> the module each is taken from on first use (PEP 562), so that
#: ``kvlab.core.validate`` and ``kvlab.core.semantics`` do not import polars with the result type.
_EXPORTS = {
    "CORE_REQUEST_COLUMNS": "kvlab.core.result",
    "HIT_SEMANTICS": "kvlab.core.semantics",
    "SINGLE_TIER": "kvlab.core.semantics",
    "TIMELINE_METRICS": "kvlab.core.result",
    "TIMELINE_SCHEMA": "kvlab.core.result",
    "TOUCH_ORDERS": "kvlab.core.semantics",
    "RunResult": "kvlab.core.result",
    "RunSummary": "kvlab.core.result",
    "bucket_sums": "kvlab.core.result",
    "check_result": "kvlab.core.result",
    "rolling_hit_ratio": "kvlab.core.result",
    "timeline_frame": "kvlab.core.result",
    "timeline_steps": "kvlab.core.result",
    "to_jsonable": "kvlab.core.result",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    """Import a name of ``kvlab.core`` on first use (PEP 562).

    Raises:
        AttributeError: an unknown name.
    """
    import importlib

    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
