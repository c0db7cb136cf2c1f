"""Teaching scenarios and the Step panel, driven headlessly."""

from __future__ import annotations

import polars as pl
import pytest

from kvlab.engines.scenarios import design_doc_example
from kvlab.ui import StepperPanel
from kvlab.viz import block_pool_chart


@pytest.mark.parametrize(("order", "last"), [
    ("classic", "request 2 arrives (29 tokens, 12 shared): hits blocks [1, 2, 3]; gets blocks [8, 9, 10, 5, 4]; "
                "evicts cached block(s) [4]"),
    ("current", "request 2 arrives (29 tokens, 12 shared): hits blocks [1, 2, 3]; gets blocks [7, 5, 8, 9, 10]"),
])
def test_design_doc_scenario(order, last) -> None:
    log = design_doc_example(order).run_all()
    assert len(log) == 5 and log[-1] == last
    queue = {"classic": "[8, 9, 10, 5, 4, 3, 7, 6, 2, 1]", "current": "[7, 5, 8, 9, 10, 4, 3, 6, 2, 1]"}[order]
    assert log[3].endswith(f"free queue (head first) {queue}")


def test_scenario_refuses_extra_steps() -> None:
    scenario = design_doc_example()
    scenario.run_all()
    with pytest.raises(ValueError, match="has no more steps"):
        scenario.step()


def states(panel: StepperPanel) -> dict[str, list]:
    """State counts of the grid layer (the dataset with a row per block)."""
    rows = max(panel.chart.chart.to_dict()["datasets"].values(), key=len)
    return pl.DataFrame(rows)["state"].value_counts(sort=True).to_dict(as_series=False)


def test_stepper_panel_steps_redraws_and_resets() -> None:
    panel = StepperPanel(lambda: design_doc_example("classic"), lambda m: block_pool_chart(m.block_pool))
    assert dict(zip(*states(panel).values())) == {"free": 10, "null": 1}
    panel.step_button.click()
    panel.step_button.click()
    counts = dict(zip(*states(panel).values()))
    assert counts["in_use"] == 7 and "request 1 arrives" in panel.log.value
    for _ in range(3):
        panel.step_button.click()
    assert panel.step_button.disabled and panel.scenario.done
    assert "evicts cached block(s) [4]" in panel.log.value
    panel.reset_button.click()
    assert not panel.scenario.log and not panel.step_button.disabled and "(press Step)" in panel.log.value
