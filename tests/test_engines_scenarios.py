"""Teaching scenarios (kvlab.engines.scenarios) and the Step panel, driven headlessly: the
exact logs notebook 03 shows."""

from __future__ import annotations

import polars as pl
import pytest

from kvlab.engines import BlockPool, KVCacheManager, Request
from kvlab.engines.scenarios import design_doc_example, fork_example, radix_growth_example, ssd_round_trip_example
from kvlab.hashing import vllm
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


def test_radix_growth_scenario() -> None:
    """A locked path survives eviction; after unlock the leaf goes, then its parent."""
    scenario = radix_growth_example(page_size=4)
    nodes = []
    for _ in range(5):
        scenario.step()
        nodes.append(scenario.model.snapshot().height)  # the root included
    assert scenario.log[3] == "evict everything: freed 4 tokens; 8 remain (8 protected)"
    assert [nodes[i] for i in (1, 3, 4)] == [4, 3, 3]  # split: root, [1..4], [5..8], [9..12]; then [5..8] evicted
    scenario.step()
    assert scenario.log[-1] == "evict everything: freed 8 tokens; 0 remain (0 protected)"
    assert scenario.model.total_size() == 0


def test_fork_scenario() -> None:
    """Block 2 is shared after the fork, copied into block 3 when c writes, written in place by p."""
    assert fork_example().run_all() == [
        "p arrives (6 tokens): no hit; gets blocks [1, 2]",
        "fork p into c: c shares blocks [1, 2]; ref counts [2, 2]",
        "c writes 1 token into the shared partial block: gets blocks [3]; tables p [1, 2], c [1, 3]; "
        "ref counts rc1=2,rc2=1",
        "p writes 3 tokens: gets blocks [4]; tables p [1, 2, 4], c [1, 3]; ref counts rc1=3,rc2=1",
        "c finishes: blocks freed in reverse; free queue (head first) [3, 5, 6, 7]",
        "p finishes: blocks freed in reverse; free queue (head first) [4, 3, 5, 6, 7, 2, 1]",
    ]


def test_ssd_round_trip_scenario() -> None:
    """Block 1 leaves lookups, its data stays on the SSD; b's lookup registers the key in
    the free queue's head block (3) and hits it, then block 3's data is read back."""
    log = ssd_round_trip_example().run_all()
    assert log == [
        "a arrives (9 tokens): no hit; gets blocks [1, 2, 3]; PagedSSDCache(capacity_blocks=4, blocks=2)",
        "a finishes: blocks freed in reverse; free queue (head first) [3, 4, 5, 2, 1]",
        "make block 1 cold: mark_block_cold(1) is True; cold blocks [1, 2]",
        "evict block 1 permanently: evict_block_permanently(1) is True: block 1 holds no hash, the pool misses "
        "its key (None), the SSD has it (True)",
        "b arrives (the same 9 tokens): hits blocks [3, 2] (1 registered from the SSD); gets blocks [4]",
        "restore b's first block: restore_block(3) is True; PagedSSDCache(capacity_blocks=4, blocks=2)",
    ]


def test_last_token_rule_table() -> None:
    """Notebook 03's table: a fully cached prompt reuses at most num_tokens - 1 tokens, in whole blocks."""
    hasher = vllm(block_size=16)
    manager = KVCacheManager(BlockPool(4, block_size=16), block_size=16)
    tokens = list(range(1000, 1033))
    warm = Request.from_tokens("warm", tokens, hasher)
    manager.allocate_slots(warm, len(tokens))
    manager.free(warm)
    hits = [manager.get_computed_blocks(Request.from_tokens(f"r{n}", tokens[:n], hasher))[1]
            for n in (16, 17, 31, 32, 33)]
    assert hits == [0, 16, 16, 16, 32]
