"""ipywidgets panels composing :mod:`kvlab.sim` and :mod:`kvlab.viz`.

=========================  ============================================================
name                       what
=========================  ============================================================
:func:`replay_panel`       capacity / touch order / warm-up controls over a replay
:func:`savings_panel`      documents per request / shuffling over CacheBlend's savings
:class:`StepperPanel`      Step / Reset through an engine scenario, chart after each step
:func:`design_explorer`    chunk size, model, tiers (GiB, policy), write policy → every tier over time
:class:`GlobalCachePanel`  workers, DRAM cache, scheduler, balancing threshold, event delay,
                           snapshot interval → local vs global cache on the timed cluster
                           (hit rate, TTFT, prefill GPU time; recomputes on its Run button)
:class:`Dashboard`         a trace picker (bundled, the given file, an upload) and a progress bar
                           over the replay panel, the design explorer and the cluster panel in
                           tabs: the page ``kvlab dashboard`` serves (:mod:`kvlab.ui.dashboard`)
=========================  ============================================================

Panels keep the computation a pure method (``compute()``) and can be driven without a
browser: set a control's ``.value`` and read ``.result``, ``.summary.value`` or
``.chart.chart``.
"""

from kvlab.ui.dashboard import Dashboard
from kvlab.ui.design_explorer import DesignExplorer, design_explorer
from kvlab.ui.global_cache_panel import GlobalCachePanel, GlobalCacheSettings, global_cache_panel
from kvlab.ui.replay_panel import UNBOUNDED, ReplayPanel, capacity_options, replay_panel
from kvlab.ui.savings_panel import SavingsPanel, savings_panel, savings_text
from kvlab.ui.stepper import StepperPanel

__all__ = ["UNBOUNDED", "Dashboard", "DesignExplorer", "GlobalCachePanel", "GlobalCacheSettings", "ReplayPanel",
           "SavingsPanel", "StepperPanel", "capacity_options", "design_explorer", "global_cache_panel", "replay_panel",
           "savings_panel", "savings_text"]
