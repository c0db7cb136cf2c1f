"""ipywidgets panels composing :mod:`kvlab.sim` and :mod:`kvlab.viz`.

=======================  ============================================================
name                     what
=======================  ============================================================
:func:`replay_panel`     capacity / touch order / warm-up controls over a replay
=======================  ============================================================

Panels keep the computation a pure method (``compute()``) and can be driven without a
browser: set a control's ``.value`` and read ``.result``, ``.summary.value`` or
``.chart.chart``.
"""

from kvlab.ui.replay_panel import UNBOUNDED, ReplayPanel, capacity_options, replay_panel

__all__ = ["UNBOUNDED", "ReplayPanel", "capacity_options", "replay_panel"]
