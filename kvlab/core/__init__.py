"""The lowest layer: what every other kvlab package shares.

=============================  ===============================================================
name                           what
=============================  ===============================================================
:class:`RunResult`             the result every driver returns: ``requests``, ``timeline``,
                               ``summary``, ``config``
:class:`RunSummary`            base of every driver's frozen summary (``to_dict()``)
:func:`check_result`           the result contract (core columns, timeline schema, summary echo)
:func:`timeline_frame`         the long ``step, time_s, tier, metric, value`` frame
:data:`TIMELINE_METRICS`       the timeline's metric names (and how a bin aggregates each)
:func:`rolling_hit_ratio`      block hit ratio over a window of steps
:mod:`kvlab.core.semantics`    replay semantics vocabulary (touch orders, hit semantics)
=============================  ===============================================================

The layer order of the whole package is in ``docs/DESIGN.md``.
"""

from kvlab.core.result import (
    CORE_REQUEST_COLUMNS,
    TIMELINE_METRICS,
    TIMELINE_SCHEMA,
    RunResult,
    RunSummary,
    check_result,
    rolling_hit_ratio,
    timeline_frame,
    to_jsonable,
)
from kvlab.core.semantics import HIT_SEMANTICS, SINGLE_TIER, TOUCH_ORDERS

__all__ = [
    "CORE_REQUEST_COLUMNS",
    "HIT_SEMANTICS",
    "SINGLE_TIER",
    "TIMELINE_METRICS",
    "TIMELINE_SCHEMA",
    "TOUCH_ORDERS",
    "RunResult",
    "RunSummary",
    "check_result",
    "rolling_hit_ratio",
    "timeline_frame",
    "to_jsonable",
]
