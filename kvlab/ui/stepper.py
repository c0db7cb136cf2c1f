"""A Step / Reset panel that walks a :class:`~kvlab.engines.scenarios.Scenario`."""

from __future__ import annotations

from collections.abc import Callable

import altair as alt
import ipywidgets as widgets

from kvlab.engines.scenarios import Scenario
from kvlab.viz.live import LiveChart


class StepperPanel:
    """Step through a scenario one action at a time, with a chart of the cache after each.

    Args:
        make_scenario: builds a fresh scenario (called again by Reset).
        render: ``scenario.model -> altair chart`` drawn after every step (e.g.
            :func:`kvlab.viz.block_pool_chart`).

    Attributes:
        step_button, reset_button: the controls; ``step_button.click()`` works headless.
        log: an HTML list of the steps run so far.
        chart: a :class:`~kvlab.viz.live.LiveChart` of the current state (``chart.chart`` is the altair chart).

    Example:
        >>> from kvlab.engines.scenarios import design_doc_example
        >>> from kvlab.viz import block_pool_chart
        >>> panel = StepperPanel(lambda: design_doc_example("classic"), lambda m: block_pool_chart(m.block_pool))
        >>> panel.step_button.click()
        >>> panel.scenario.log[-1]
        'request 0 arrives (18 tokens): no hit; gets blocks [1, 2, 3, 4, 5]'
    """

    def __init__(self, make_scenario: Callable[[], Scenario], render: Callable[[object], alt.TopLevelMixin]) -> None:
        self._make, self._render = make_scenario, render
        self.scenario = make_scenario()
        self.step_button = widgets.Button(description="Step", icon="step-forward")
        self.reset_button = widgets.Button(description="Reset", icon="undo")
        self.log = widgets.HTML()
        self.chart = LiveChart(render(self.scenario.model))
        self.step_button.on_click(lambda _: self.step())
        self.reset_button.on_click(lambda _: self.reset())
        self.ui = widgets.VBox([widgets.HTML(f"<b>{self.scenario.title}</b>"),
                                widgets.HBox([self.step_button, self.reset_button]), self.log, self.chart])
        self._refresh()

    def step(self) -> None:
        """Run the next step (no-op when done) and redraw."""
        if not self.scenario.done:
            self.scenario.step()
        self._refresh()

    def reset(self) -> None:
        """Start the scenario again from a fresh model."""
        self.scenario = self._make()
        self._refresh()

    def _refresh(self) -> None:
        items = "".join(f"<li>{line}</li>" for line in self.scenario.log) or "<li>(press Step)</li>"
        self.log.value = f"<ol>{items}</ol>"
        self.step_button.disabled = self.scenario.done
        self.chart.chart = self._render(self.scenario.model)

    def _repr_mimebundle_(self, **kwargs: object) -> dict:
        return self.ui._repr_mimebundle_(**kwargs)
